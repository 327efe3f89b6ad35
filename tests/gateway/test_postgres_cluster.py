"""The throwaway PostgreSQL cluster the several-process tests run on (issue 19)."""

from __future__ import annotations

import psycopg

from tests.fakes.postgres import PostgresCluster


def test_each_test_gets_its_own_empty_database(postgres_url: str,
                                                 postgres_cluster: PostgresCluster) -> None:
    with psycopg.connect(postgres_url) as conn:
        conn.execute("CREATE TABLE t (x int)")
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
    other = postgres_cluster.fresh_database()
    with psycopg.connect(other) as conn:
        found = conn.execute("SELECT to_regclass('t')").fetchone()
    assert found == (None,)
