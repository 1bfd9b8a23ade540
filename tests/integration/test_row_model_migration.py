"""Migrations 0024 and 0025 on a ledger holding rows stored before them: every row gets
the model the ledger reads from its request when it stores one (row_model.py), rows that
name none are left NULL, and no row the backfill cannot read stops the migration."""

from __future__ import annotations

import asyncpg
import orjson

from relay_batches.ledger.migrate import apply_migrations
from relay_batches.ledger.row_model import row_model
from tests.helpers.support import create_isolation, drop_isolation

NEW = ["0024_row_model.sql", "0025_row_model_backfill.sql"]
STORED = [
    '[{"content":"a \\"model\\"","role":"user"}]',
    '{"messages":[{"content":"hi","role":"user"}]}',
    '{"messages":[{"content":"the \\"model\\" word","role":"user"}]}',
    '{"max_tokens":5,"messages":[],"model":"gpt-x"}',
    '{"messages":[],"model":"\\u00e9t\\u00e9"}',
    orjson.dumps({"messages": [{"content": "a\x00b"}], "model": "with-nul-text"}).decode(),
    orjson.dumps({"messages": [], "model": "half\x00"}).decode(),
    '{"messages":[],"model":null}',
    '{"messages":[],"model":5}',
    '{"messages": [ "model"',
]


async def test_the_backfill_gives_each_stored_row_the_model_the_ledger_reads() -> None:
    iso = await create_isolation("rowmodel")
    conn = await asyncpg.connect(iso.database_url, timeout=10)
    try:
        # The ledger as it was before 0024 (later migrations do not touch batch_rows).
        await conn.execute("ALTER TABLE batch_rows DROP COLUMN model")
        await conn.execute("DELETE FROM schema_migrations WHERE name = ANY($1::text[])", NEW)
        await conn.executemany(
            "INSERT INTO batch_rows (batch_id, row_index, custom_id, request)"
            " VALUES ('old', $1, $2, $3)",
            [(i, f"c-{i}", text) for i, text in enumerate(STORED)],
        )
        assert await apply_migrations(conn) == NEW
        found = await conn.fetch(
            "SELECT row_index, model FROM batch_rows WHERE batch_id = 'old' ORDER BY row_index"
        )
        assert [r["model"] for r in found] == [row_model(text) for text in STORED]
        assert [r["model"] for r in found] == [
            None, None, None, "gpt-x", "été", "with-nul-text", "", None, "", ""
        ]  # fmt: skip
    finally:
        await conn.close()
        await drop_isolation(iso)
