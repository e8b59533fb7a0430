"""The verl backend (``backend: verl``): model groups trained by verl's FSDP2 engine; see ``docs/verl.md``.

The group class lives in :mod:`unimas.groups.verl.group`; this package init imports nothing, so the
pure planning helpers (:mod:`.plan`, :mod:`.names`) stay cheap to import. What it shares with the torch
backend comes from :mod:`unimas.groups` (the kit), never from :mod:`unimas.groups.torch`.

May import: algorithms, config, errors, groups, process, safe_load.
"""
