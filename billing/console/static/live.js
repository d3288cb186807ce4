// Live batch progress on /batches: polls the JSON API every second and updates the table in place
// (text only: values are set with textContent, never as HTML); a new batch gets a new row at the top.
"use strict";
(function () {
  const table = document.getElementById("batches");
  if (!table) return;
  const known = new Set(Array.from(table.querySelectorAll("tr[data-batch]"), (row) => row.dataset.batch));
  const number = (value) => (value === null || value === undefined ? "—" : Number(value).toLocaleString("en-US"));
  const when = (text) => (text ? text.slice(0, 19).replace("T", " ") + " UTC" : "—");

  function update(batch, row) {
    const set = (field, text) => {
      const cell = row.querySelector(`[data-field="${field}"]`);
      if (cell) cell.textContent = text;
    };
    const state = row.querySelector('[data-field="state"]');
    state.textContent = batch.state;
    state.className = `state state-${batch.state}`;
    row.querySelector('[data-field="progress"]').value = batch.progress || 0;
    set("items", `${batch.completed_items}/${batch.work_items === null ? "?" : batch.work_items}`);
    set("rows", number(batch.rows));
    set("accepted", number(batch.accepted));
    set("rejected", number(batch.rejected));
    set("accepted_at", when(batch.accepted_at));
    set("latency_seconds", batch.latency_seconds === null ? "—" : batch.latency_seconds.toFixed(1));
    set("requests_per_1000", batch.requests_per_1000 === null ? "—" : String(batch.requests_per_1000));
  }

  const find = (id) => Array.from(table.querySelectorAll("tr[data-batch]")).find((r) => r.dataset.batch === id);

  function add(id) {
    const row = document.createElement("tr");
    row.dataset.batch = id;
    const cell = (field, numeric) => {
      const td = document.createElement("td");
      if (field) td.dataset.field = field;
      if (numeric) td.className = "num";
      row.appendChild(td);
      return td;
    };
    const link = document.createElement("a");
    link.href = `/batches/${encodeURIComponent(id)}`;
    link.textContent = id;
    cell("").appendChild(link);
    cell("state");
    const progress = cell("");
    const bar = document.createElement("progress");
    bar.max = 1;
    bar.dataset.field = "progress";
    const items = document.createElement("span");
    items.dataset.field = "items";
    progress.append(bar, " ", items);
    for (const field of ["rows", "accepted", "rejected"]) cell(field, true);
    cell("accepted_at");
    cell("latency_seconds", true);
    cell("requests_per_1000", true);
    const empty = table.querySelector("tr.empty");
    if (empty) empty.remove();
    table.tBodies[0].prepend(row);
    known.add(id);
    return row;
  }

  async function poll() {
    try {
      const response = await fetch(table.dataset.live, { headers: { Accept: "application/json" } });
      if (response.ok) {
        const page = await response.json();
        for (const batch of page.items) {
          const row = known.has(batch.batch_id) ? find(batch.batch_id) : add(batch.batch_id);
          if (row) update(batch, row);
        }
      }
    } catch (error) {
      // the server is restarting: try again at the next tick
    }
    window.setTimeout(poll, 1000);
  }
  window.setTimeout(poll, 1000);
})();
