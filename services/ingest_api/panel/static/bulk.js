// The job list's bulk actions: cancel or delete the selected jobs after one confirmation
// (a modal <dialog> naming them), a few requests at a time, then one line saying what
// was done and what could not be, and why.

import { api } from "./api.js";
import { CANCELABLE, TERMINAL, fill, h } from "./dom.js";

const AT_ONCE = 4; // requests in flight at a time

export const ACTIONS = {
  cancel: {
    applies: (batch) => CANCELABLE.has(batch.status),
    call: (batch) => api.cancel(batch.id),
    verb: "Cancel",
    done: "Canceled",
    text: "They stop now; rows already done keep their results, the rest are not run.",
  },
  delete: {
    applies: (batch) => TERMINAL.has(batch.status) || Boolean(batch.cron),
    call: (batch) => api.remove(batch.id),
    verb: "Delete",
    done: "Deleted",
    text: "They are deleted for good, with their rows, results, dead letters and webhook" +
      " deliveries (a cron template spawns no more runs).",
  },
};

function plural(n, word) {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

/** Ask once for the batches action applies to; resolves to true when confirmed. */
export function confirmBulk(kind, batches) {
  const action = ACTIONS[kind];
  const dialog = document.getElementById("bulk-dialog");
  document.getElementById("bulk-dialog-title").textContent =
    `${action.verb} ${plural(batches.length, "job")}?`;
  document.getElementById("bulk-dialog-text").textContent = action.text;
  fill(document.getElementById("bulk-dialog-list"),
    batches.map((b) => h("li", {}, b.name, " ", h("span", { class: "muted" }, `(${b.status})`))));
  document.getElementById("bulk-dialog-go").textContent = `${action.verb} ${plural(batches.length, "job")}`;
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "go"), { once: true });
    dialog.showModal();
  });
}

/** Run the action on every batch, AT_ONCE at a time; a sentence of what happened. */
export async function runBulk(kind, batches) {
  const action = ACTIONS[kind];
  const failed = [];
  let done = 0;
  const queue = [...batches];
  async function worker() {
    for (let batch = queue.shift(); batch; batch = queue.shift()) {
      try {
        await action.call(batch);
        done += 1;
      } catch (err) {
        failed.push(`${batch.name}: ${err.message}`);
      }
    }
  }
  await Promise.all(Array.from({ length: Math.min(AT_ONCE, queue.length) }, worker));
  const said = `${action.done} ${plural(done, "job")}.`;
  return failed.length ? `${said} Not ${failed.length}: ${failed.join("; ")}` : said;
}
