"""A YAML reader for configs that a hostile file cannot blow up.

PyYAML's safe loader still expands aliases (a 530-byte "billion laughs" file becomes
gigabytes), keeps the last of two equal keys silently, and turns a 5000-digit integer
into a ValueError from deep inside its constructor. A config needs none of these, so:
- an alias (`*name`) is refused where the parser meets it, before anything is built;
- a mapping that repeats a key is refused;
- an integer longer than MAX_INT_DIGITS digits is refused;
- the file itself may be at most MAX_CONFIG_BYTES.
"""

from __future__ import annotations

import yaml

MAX_CONFIG_BYTES = 1 << 20
MAX_INT_DIGITS = 30


class UnsafeYaml(ValueError):
    """A config uses a YAML feature that headprune refuses; the message says which and where."""


def _where(node_or_event) -> str:
    mark = getattr(node_or_event, "start_mark", None)
    return f"line {mark.line + 1}" if mark is not None else "somewhere"


class _Loader(yaml.SafeLoader):
    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise UnsafeYaml(f"{_where(event)}: YAML aliases (*{str(event.anchor)[:40]}) are not allowed in a config")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            hashable = key if isinstance(key, (str, int, float, bool, type(None))) else repr(key)
            if hashable in seen:
                raise UnsafeYaml(f"{_where(key_node)}: key {str(key)[:40]!r} appears twice in one mapping")
            seen.add(hashable)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        digits = sum(c.isdigit() for c in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise UnsafeYaml(f"{_where(node)}: an integer of {digits} digits is not a sensible config value")
        return super().construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:map", _Loader.construct_yaml_map)


def safe_load(text: str):
    """yaml.safe_load without aliases, duplicate keys or giant integers (UnsafeYaml)."""
    if len(text) > MAX_CONFIG_BYTES:
        raise UnsafeYaml(f"{len(text)} characters; a config is at most {MAX_CONFIG_BYTES}")
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
