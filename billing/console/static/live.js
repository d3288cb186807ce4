// Live batch progress on /batches: polls the JSON API every second and updates the table in place
// (text only: values are set with textContent, never as HTML). New batches reload the page once.
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

  async function poll() {
    try {
      const response = await fetch(table.dataset.live, { headers: { Accept: "application/json" } });
      if (response.ok) {
        const page = await response.json();
        for (const batch of page.items) {
          if (!known.has(batch.batch_id)) {
            window.location.reload();
            return;
          }
          const row = Array.from(table.querySelectorAll("tr[data-batch]")).find((r) => r.dataset.batch === batch.batch_id);
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
