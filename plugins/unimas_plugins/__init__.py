"""Built-in unimas plugins, registered through the `unimas` entry-point group like any third-party plugin."""
