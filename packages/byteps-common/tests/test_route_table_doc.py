"""docs/architecture.md lists every route a partition can take, exactly as byteps.common.engine.route has them."""

from __future__ import annotations

import pathlib

from byteps.common.engine.route import ROUTES, route_table

DOC = pathlib.Path(__file__).resolve().parents[3] / "docs" / "architecture.md"


def test_the_route_table_in_architecture_md_is_the_codes():
    text = DOC.read_text()
    assert route_table() in text, (
        "docs/architecture.md's route table differs from byteps.common.engine.route; paste this:\n" + route_table())


def test_every_route_ends_where_its_result_is():
    for route in ROUTES.values():
        assert route.stages.count(route.stages[0]) == 1
        if route.servers and route.role.name != "PEER":
            assert "EXCHANGE" in [stage.name for stage in route.stages]
