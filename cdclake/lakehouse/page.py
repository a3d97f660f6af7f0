"""The Lakehouse page: one HTML table of :class:`cdclake.lakehouse.status.TableStatus`, rendered on the
server (every value escaped), with per-table buttons that POST JSON to the app's action routes and
link to the run they created. Paths are relative: the page works under whatever prefix the
api-server mounts it at, inside the Airflow UI's frame or on its own."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from html import escape

from cdclake.contracts.events import RESERVED_SUFFIXES
from cdclake.contracts.watermark import EVENT_COUNTS
from cdclake.lakehouse.same_origin import HEADER as ACTION_HEADER
from cdclake.lakehouse.status import TableStatus

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1rem; color: #1a202c; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #cbd5e0; padding: 4px 6px; vertical-align: top; text-align: right; }
th { background: #edf2f7; } td.name, td.actions, td.reasons { text-align: left; }
.candidate { color: #b7791f; font-weight: 600; } .error { color: #c53030; font-weight: 600; }
small { color: #4a5568; } input { width: 9rem; } input[type=number] { width: 3rem; }
"""

SCRIPT = """
async function act(button, path, body) {
  const out = button.closest('tr').querySelector('[data-role=run]');
  out.textContent = 'triggering...';
  // The header is the page's proof of origin (cdclake/lakehouse/same_origin.py).
  const r = await fetch(path, {method: 'POST', credentials: 'same-origin',
    headers: {'Content-Type': 'application/json', 'ACTION_HEADER': '1'}, body: JSON.stringify(body)});
  const answer = await r.json().catch(() => ({}));
  if (!r.ok) { out.textContent = 'refused: HTTP ' + r.status + ' ' + (answer.detail || ''); return; }
  out.textContent = '';
  const a = document.createElement('a');
  a.href = answer.url; a.textContent = answer.dag_id + ' ' + answer.run_id;
  a.dataset.runId = answer.run_id; a.dataset.dagId = answer.dag_id;
  a.onclick = (event) => openInUi(event, a);
  out.appendChild(a);
}
// The UI frames this page with sandbox="allow-scripts allow-same-origin ...", without
// allow-top-navigation: a target=_top link is blocked. Same origin, so the run page is opened
// by the UI's own router instead (a history entry and a popstate, as the Back button makes);
// elsewhere (the page opened on its own) the link is followed as usual.
function openInUi(event, a) {
  try {
    if (window.top === window) return;
    window.top.history.pushState(null, '', a.pathname + a.search);
    window.top.dispatchEvent(new PopStateEvent('popstate', {state: null}));
    event.preventDefault();
  } catch (e) { /* not the same origin: follow the link in this frame */ }
}
function compact(button, table) {
  const row = button.closest('tr');
  const where = row.querySelector('input[name=where]').value.trim();
  const body = {table: table, min_input_files: Number(row.querySelector('input[name=min_input_files]').value)};
  act(button, 'v1/compaction/run', where ? {...body, where: where} : body);
}
""".replace("ACTION_HEADER", ACTION_HEADER)

PAGE_MIN_FILES = 2
"""The Compact button's min_input_files: asked for by name, a table's small files are merged
even below the schedule's 5 (iceberg_compaction compacts a named table whatever its health)."""

HEADERS = (
    "table",
    "rows",
    "data files (small)",
    "delete files",
    "snapshots",
    "last apply: received = applied + duplicate + superseded + late + quarantined",
    "freshness by commit time: oldest pending waited / since last commit",
    "freshness by event time: now - valid-through",
    "pending staging objects",
    "quarantined events: top reasons",
    "compaction candidate",
    "actions",
)


def _time(ms: int | None) -> str:
    return "-" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h {s % 3600 // 60:02d}m {s % 60:02d}s" if s >= 3600 else f"{s // 60}m {s % 60:02d}s"


def _cell(col: str, text: str, cls: str = "") -> str:
    return f'<td data-col="{col}"{f" class={cls!r}" if cls else ""}>{text}</td>'


def _accounting(s: TableStatus) -> str:
    a = s.last_apply
    if a is None:
        return "-"
    when = escape(_time(a.committed_ms))
    if all(v is None for v in a.counts.values()):
        return f"{when}<br><small>(no accounting: a side table)</small>"
    shown = [f'{k} <span data-count="{k}">{"-" if a.counts[k] is None else a.counts[k]}</span>' for k in EVENT_COUNTS]
    return f"{when}<br>{shown[0]} = {' + '.join(shown[1:])}"


def _reasons(s: TableStatus) -> str:
    if s.quarantined is None:
        return "-" if s.table.endswith(RESERVED_SUFFIXES) else "- <small>(no quarantine table)</small>"
    reasons = "".join(f"<br><small>{escape(r)}: {n}</small>" for r, n in s.top_reasons)
    return f'<span data-count="quarantined">{s.quarantined}</span>{reasons}'


def _held(s: TableStatus) -> str:
    """A publish held by a failing expectation, and its Release button."""
    if not s.held:
        return ""
    js_name = escape(json.dumps(s.table))
    why = "".join(f"<br><small>{escape(h)}</small>" for h in s.held)
    if s.released:
        return f'<p class="error" data-role="held">Publish held, released: the next apply publishes once{why}</p>'
    return (
        f'<p class="error" data-role="held">Publish held by an expectation{why}</p>'
        f"<button onclick=\"act(this, 'v1/holds/release', {{table: {js_name}}})\">Release</button> "
    )


def _actions(s: TableStatus) -> str:
    return _held(s) + _table_actions(s)


def _table_actions(s: TableStatus) -> str:
    t = escape(s.table)
    js_name = escape(json.dumps(s.table))  # a JS string literal, then attribute-escaped
    # A side table (<t>__changes, ...) is written by its CDC table's apply: nothing to apply by itself.
    apply = (
        ""
        if s.table.endswith(RESERVED_SUFFIXES)
        else f"<button onclick=\"act(this, 'v1/apply', {{table: {js_name}}})\">Apply</button> "
    )
    if not s.exists:  # staged, no Iceberg table yet: nothing to compact or expire (the API says 404)
        return apply + '<div data-role="run"></div>'
    return (
        apply + f'<input name="where" placeholder="partition filter" aria-label="partition filter for {t}"> '
        f'<input name="min_input_files" type="number" min="1" value="{PAGE_MIN_FILES}" '
        f'aria-label="min input files for {t}" title="min input files"> '
        f'<button onclick="compact(this, {js_name})">Compact</button> '
        f"<button onclick=\"act(this, 'v1/expire', {{table: {js_name}}})\">Expire</button>"
        '<div data-role="run"></div>'
    )


def row(s: TableStatus) -> str:
    cells = [
        _cell("table", escape(s.table) + ("" if s.exists else " <small>(not created yet)</small>"), "name"),
        _cell("rows", str(s.rows)),
        _cell("data_files", f'{s.data_files} <small>(<span data-col="small_files">{s.small_files}</span>)</small>'),
        _cell("delete_files", str(s.delete_files)),
        _cell("snapshots", str(s.snapshots)),
        _cell("last_apply", _accounting(s)),
        _cell("freshness_commit", f"{_age(s.freshness_commit_s)} / {_age(s.since_commit_s)}"),
        _cell("freshness_event", f"{_age(s.freshness_event_s)}<br><small>{_time(s.valid_through_ms)}</small>"),
        _cell("pending_objects", str(s.pending_objects)),
        _cell("quarantined", _reasons(s), "reasons"),
        _cell("compaction_candidate", "yes" if s.compaction_candidate else "no", "candidate" * s.compaction_candidate),
        _cell("actions", _actions(s), "actions"),
    ]
    return f'<tr data-table="{escape(s.table)}">{"".join(cells)}</tr>'


def render(statuses: list[TableStatus], error: str | None, now_ms: int) -> str:
    if error:
        body = f'<p class="error" data-role="error">The catalog or staging could not be read: {escape(error)}</p>'
    elif not statuses:
        body = "<p>No tables yet: nothing has been landed or applied.</p>"
    else:
        head = "".join(f"<th>{escape(h)}</th>" for h in HEADERS)
        body = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(row(s) for s in statuses)}</tbody></table>"
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>Lakehouse</title>'
        f"<style>{STYLE}</style><script>{SCRIPT}</script></head><body>"
        f"<h1>Lakehouse</h1><p><small>as of {_time(now_ms)}</small></p>{body}</body></html>"
    )
