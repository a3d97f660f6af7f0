"""The source-side workload of the Debezium tests: tables, a snapshot, then streamed changes.

Postgres and MariaDB get the same shapes: a table keyed on ``id`` with plain types
(``customers``), one with the types whose JSON form depends on the schema (``accounts``), a
composite key (``order_lines``) and a composite key that repeats ``id`` across tenants
(``tenant_users``). Statements only; what landed is compared by the tests.
"""

from __future__ import annotations

KEYS: dict[str, tuple[str, ...]] = {
    "customers": ("id",),
    "accounts": ("id",),
    "order_lines": ("order_id", "line_no"),
    "tenant_users": ("tenant", "id"),
    "docs": ("id",),
    "burst": ("id",),
    "bulky": ("id",),
    "marks": ("id",),
}
# Incompressible text well past the 2 kB TOAST threshold: stored out of line, so an UPDATE
# that does not touch it streams Debezium's __debezium_unavailable_value placeholder.
LONG_TEXT_SQL = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 1185) g)"  # 37,920 chars

PG_SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, active boolean, uid uuid, tags text[]);
CREATE TABLE accounts (
  id bigint PRIMARY KEY, balance numeric(38,10), amount numeric, opened date, seen timestamp,
  seen_tz timestamptz, doc jsonb, j json, raw bytea, small smallint, i int, r real, d double precision
);
CREATE TABLE order_lines (order_id int, line_no int, sku text, qty int, PRIMARY KEY (order_id, line_no));
CREATE TABLE tenant_users (tenant text, id int, name text, PRIMARY KEY (tenant, id));
CREATE TABLE docs (id int PRIMARY KEY, body text);
CREATE TABLE burst (id int PRIMARY KEY, n int, pad text);
CREATE TABLE bulky (id int PRIMARY KEY, body text);
CREATE TABLE marks (id int PRIMARY KEY);
"""

PG_SNAPSHOT = """
INSERT INTO customers VALUES
  (1, 'Ada', true, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', ARRAY['x', 'y"q', NULL]),
  (2, 'Bob', false, NULL, '{}'), (3, 'Émile', NULL, NULL, NULL),
  (4, 'Dee', true, NULL, ARRAY['k']), (5, 'Eve', true, NULL, NULL);
INSERT INTO accounts VALUES
  (1, 1234567890123456789012345678.0123456789, 3.14159, '2024-02-29', '2024-02-29 13:14:15.123456',
   '2024-02-29 13:14:15.123456+02', '{"a": [1, 2], "b": null}', '{"k": "v"}', '\\xdeadbeef', -32768,
   2147483647, 1.5, 2.25),
  (2, -0.0000000001, -1.5, '1970-01-01', '1970-01-01 00:00:00', '1970-01-01 00:00:00+00', '[]', '1',
   '\\x', 32767, -2147483648, -0.5, 1e300),
  (3, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
INSERT INTO order_lines VALUES (1, 1, 'apple', 3), (1, 2, 'pear', 1), (2, 1, 'fig', 7);
INSERT INTO tenant_users VALUES ('acme', 1, 'Ann'), ('globex', 1, 'Gus'), ('acme', 2, 'Al');
"""
PG_SNAPSHOT += f"INSERT INTO docs VALUES (1, {LONG_TEXT_SQL}), (2, 'short');\n"

PG_STREAM = [
    "INSERT INTO customers VALUES (6, 'Fay', false, 'b1eebc99-9c0b-4ef8-bb6d-6bb9bd380a22', ARRAY['z'])",
    "UPDATE customers SET name = 'Bobby', active = true WHERE id = 2",
    "DELETE FROM customers WHERE id = 3",
    "UPDATE customers SET id = 40 WHERE id = 4",
    # one transaction, several rows and tables
    "BEGIN; INSERT INTO customers VALUES (7, 'Gil', true, NULL, NULL); "
    "UPDATE accounts SET balance = balance + 1, seen_tz = '2025-01-01 00:00:00+00' WHERE id = 1; "
    "INSERT INTO order_lines VALUES (2, 2, 'kiwi', 2); COMMIT",
    "UPDATE order_lines SET qty = 5 WHERE order_id = 1 AND line_no = 2",
    "DELETE FROM order_lines WHERE order_id = 1 AND line_no = 1",
    "INSERT INTO tenant_users VALUES ('initech', 1, 'Ian')",
    "UPDATE tenant_users SET name = 'Anna' WHERE tenant = 'acme' AND id = 1",
    "INSERT INTO accounts VALUES (4, 99.5, 12345678901234567890.5, '2000-01-01', '2000-01-01 00:00:01', "
    "'2000-01-01 00:00:01+05:30', '{\"n\": 1}', '{}', '\\x00ff', 1, 2, 3, 4)",
    # a key change that leaves the TOASTed body alone, then a column added with a default
    "UPDATE docs SET id = 10 WHERE id = 1",
    "ALTER TABLE docs ADD COLUMN score int NOT NULL DEFAULT 0",
    "INSERT INTO docs VALUES (3, 'new', 5)",
]

# One 20,000-row transaction, then one of 200 rows x 40,000 chars (8 MB).
PG_BURST = "INSERT INTO burst SELECT g, g * 7, md5(g::text) FROM generate_series(1, 20000) g"
PG_BULKY = "INSERT INTO bulky SELECT g, repeat(md5(g::text), 1250) FROM generate_series(1, 200) g"

MARIA_SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, active boolean, uid uuid, tags json);
CREATE TABLE accounts (
  id bigint PRIMARY KEY, balance decimal(38,10), amount decimal(30,5), opened date, seen datetime(6),
  seen_tz timestamp(6) NULL, doc json, j json, raw varbinary(16), small smallint, i int, r float, d double
);
CREATE TABLE order_lines (order_id int, line_no int, sku text, qty int, PRIMARY KEY (order_id, line_no));
CREATE TABLE tenant_users (tenant varchar(32), id int, name text, PRIMARY KEY (tenant, id));
CREATE TABLE marks (id int PRIMARY KEY);
"""

MARIA_SNAPSHOT = """
SET time_zone = '+00:00';
INSERT INTO customers VALUES
  (1, 'Ada', true, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '["x", "y\\\\"q", null]'),
  (2, 'Bob', false, NULL, '[]'), (3, 'Émile', NULL, NULL, NULL),
  (4, 'Dee', true, NULL, '["k"]'), (5, 'Eve', true, NULL, NULL);
INSERT INTO accounts VALUES
  (1, 1234567890123456789012345678.0123456789, 3.14159, '2024-02-29', '2024-02-29 13:14:15.123456',
   '2024-02-29 11:14:15.123456', '{"a": [1, 2], "b": null}', '{"k": "v"}', x'deadbeef', -32768,
   2147483647, 1.5, 2.25),
  (2, -0.0000000001, -1.5, '1970-01-01', '1970-01-01 00:00:00', '1970-01-01 00:00:01', '[]', '1',
   x'', 32767, -2147483648, -0.5, 1e300),
  (3, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
INSERT INTO order_lines VALUES (1, 1, 'apple', 3), (1, 2, 'pear', 1), (2, 1, 'fig', 7);
INSERT INTO tenant_users VALUES ('acme', 1, 'Ann'), ('globex', 1, 'Gus'), ('acme', 2, 'Al');
"""

MARIA_STREAM = [
    "INSERT INTO customers VALUES (6, 'Fay', false, 'b1eebc99-9c0b-4ef8-bb6d-6bb9bd380a22', '[\"z\"]')",
    "UPDATE customers SET name = 'Bobby', active = true WHERE id = 2",
    "DELETE FROM customers WHERE id = 3",
    "UPDATE customers SET id = 40 WHERE id = 4",
    "START TRANSACTION; INSERT INTO customers VALUES (7, 'Gil', true, NULL, NULL); "
    "UPDATE accounts SET balance = balance + 1, seen_tz = '2025-01-01 00:00:00' WHERE id = 1; "
    "INSERT INTO order_lines VALUES (2, 2, 'kiwi', 2); COMMIT",
    "UPDATE order_lines SET qty = 5 WHERE order_id = 1 AND line_no = 2",
    "DELETE FROM order_lines WHERE order_id = 1 AND line_no = 1",
    "INSERT INTO tenant_users VALUES ('initech', 1, 'Ian')",
    "UPDATE tenant_users SET name = 'Anna' WHERE tenant = 'acme' AND id = 1",
    "INSERT INTO accounts VALUES (4, 99.5, 12345678901234567890.5, '2000-01-01', '2000-01-01 00:00:01', "
    "'2000-01-01 00:00:01', '{\"n\": 1}', '{}', x'00ff', 1, 2, 3, 4)",
]
