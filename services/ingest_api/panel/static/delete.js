// The Delete confirmation of the job page (a modal <dialog>): an ended job or a cron
// template, with everything stored for it.

import { api } from "./api.js";

/** Ask for confirmation; delete the job if confirmed. Resolves to true once deleted. */
export function confirmDelete(batch) {
  const dialog = document.getElementById("delete-dialog");
  const what = batch.cron
    ? "The template spawns no more runs; the runs it made keep their results."
    : "Its rows, results, dead letters and webhook deliveries go.";
  document.getElementById("delete-dialog-text").textContent =
    `"${batch.name}" (${batch.status}) is deleted for good. ${what}`;
  dialog.returnValue = "";
  return new Promise((resolve, reject) => {
    dialog.addEventListener(
      "close",
      () => {
        if (dialog.returnValue !== "delete") return resolve(false);
        api.remove(batch.id).then(() => resolve(true), reject);
      },
      { once: true },
    );
    dialog.showModal();
  });
}
