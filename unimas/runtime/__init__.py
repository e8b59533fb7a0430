"""The star: controller-side routing and the transports to model groups."""
