// The Cancel confirmation shared by the job list and the job page (a modal <dialog>).

import { api } from "./api.js";

/** Ask for confirmation; cancel the job if confirmed. Resolves to the batch, or null. */
export function confirmCancel(batch) {
  const dialog = document.getElementById("cancel-dialog");
  document.getElementById("cancel-dialog-text").textContent =
    `"${batch.name}" (${batch.status}) stops now. Rows already done keep their results; ` +
    "the rest are not run.";
  dialog.returnValue = "";
  return new Promise((resolve, reject) => {
    dialog.addEventListener(
      "close",
      () => {
        if (dialog.returnValue !== "cancel") return resolve(null);
        api.cancel(batch.id).then(resolve, reject);
      },
      { once: true },
    );
    dialog.showModal();
  });
}
