"""Single-key mutations of a YAML document, for the fuzz tests of input files."""

import copy


def key_paths(node, prefix=()):
    """Every key path of nested dicts, e.g. ``("cores", "sram", "capacity_mb")``."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield prefix + (k,)
            yield from key_paths(v, prefix + (k,))


def mutated(data, path, value):
    """A deep copy of ``data`` with the key at ``path`` set to ``value``."""
    out = copy.deepcopy(data)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out
