"""The ``runtime`` section made real: model groups built from plugins and reached in process or as Ray actors.

``build`` turns a ``models.<group>`` entry into a group through its
backend plugin; ``local`` and ``ray_actors`` are the two transports,
``transport`` chooses one, ``placement`` packs Ray groups onto nodes and GPUs,
``cluster_file`` reads a cluster described on paper for that planner.

May import: algorithms, config, contract, errors, groups, process.
"""
