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


def loads_or_raises_our_error(load, path, data, key, value) -> None:
    """Write ``data`` with ``key`` set to ``value`` as YAML at ``path`` and ``load`` it: it loads, or
    raises the project's own error (anything else fails the test). A value YAML cannot write is
    skipped."""
    import yaml

    from npusim.errors import NpusimError

    try:
        path.write_text(yaml.safe_dump(mutated(data, key, value)))
    except (yaml.YAMLError, UnicodeEncodeError):
        return
    try:
        load(path)
    except NpusimError:
        pass
