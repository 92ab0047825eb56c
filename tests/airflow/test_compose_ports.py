"""docker-compose.yaml publishes every port on loopback by default (``EPOCHAL_BIND_ADDRESS`` opens it up)."""
from __future__ import annotations

import re

import pytest
import yaml
from af_helpers import REPO

pytestmark = [pytest.mark.unit]


def test_every_published_port_binds_to_loopback_by_default():
    compose = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    published = [(name, p) for name, svc in compose["services"].items() for p in svc.get("ports", []) or []]
    assert published
    for name, p in published:
        spec = p if isinstance(p, str) else f"{p.get('host_ip', '')}:{p.get('published')}:{p.get('target')}"
        host = re.sub(r"\$\{EPOCHAL_BIND_ADDRESS:-([^}]+)\}", r"\1", spec).rsplit(":", 2)[0]
        assert host == "127.0.0.1", f"service {name} publishes {spec!r} on all interfaces"
