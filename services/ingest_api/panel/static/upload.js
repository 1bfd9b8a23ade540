// The upload form: files plus options, one job per file via POST /v1/batches/upload.
// An error names a field (shown under it) or a file (shown next to that file).

import { ApiError, api } from "./api.js";
import { fill, h, setText } from "./dom.js";

const FIELDS = ["model", "priority", "name", "webhookUrl", "cron", "budget_usd"];
const FIELD_IDS = {
  model: "model",
  priority: "priority",
  name: "name",
  webhookUrl: "webhook",
  cron: "cron",
  budget_usd: "budget",
};
const FILE_PARAM = /^file\[(\d+)\]$/;
const FROM_ROWS = "From each file's rows";

function sizeText(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
}

function renderFiles(errorIndex = null, message = "") {
  const files = [...document.getElementById("files").files];
  fill(
    document.getElementById("file-list"),
    files.map((file, i) => {
      const failed = i === errorIndex;
      return h(
        "li",
        { dataset: { fileIndex: String(i) }, class: failed ? "has-error" : null },
        h("span", { class: "file-name" }, file.name),
        h("span", { class: "muted" }, ` ${sizeText(file.size)}`),
        failed ? h("p", { class: "field-error", role: "alert", id: `file-error-${i}` }, message) : null,
      );
    }),
  );
}

function clearErrors() {
  for (const field of FIELDS) {
    setText(`${field}-error`, "");
    document.getElementById(FIELD_IDS[field]).removeAttribute("aria-invalid");
  }
  setText("file-error", "");
  setText("upload-error", "");
  document.getElementById("files").removeAttribute("aria-invalid");
  renderFiles();
}

function showError(err) {
  const fileMatch = FILE_PARAM.exec(err.param ?? "");
  if (fileMatch) {
    renderFiles(Number(fileMatch[1]), err.message);
    document.getElementById("files").setAttribute("aria-invalid", "true");
  } else if (err.param === "file") {
    setText("file-error", err.message);
    document.getElementById("files").setAttribute("aria-invalid", "true");
  } else if (FIELDS.includes(err.param)) {
    setText(`${err.param}-error`, err.message);
    const input = document.getElementById(FIELD_IDS[err.param]);
    input.setAttribute("aria-invalid", "true");
    input.focus();
  } else {
    setText("upload-error", err.message);
  }
}

function formData() {
  const form = new FormData();
  for (const field of FIELDS) {
    form.append(field, document.getElementById(FIELD_IDS[field]).value);
  }
  for (const file of document.getElementById("files").files) form.append("file", file, file.name);
  return form;
}

async function submit(event, onCreated) {
  event.preventDefault();
  clearErrors();
  if (!document.getElementById("files").files.length) {
    showError(new ApiError(400, "invalid_request_error", "Choose at least one .csv or .jsonl file.", "file"));
    return;
  }
  const button = document.getElementById("upload-submit");
  button.disabled = true;
  button.textContent = "Uploading…";
  try {
    const created = await api.upload(formData());
    document.getElementById("upload-form").reset();
    renderFiles();
    onCreated(created.data);
  } catch (err) {
    showError(err);
  } finally {
    button.disabled = false;
    button.textContent = "Create jobs";
  }
}

/** Fill the model select from GET /v1/models (keeping the current choice), then the
 * blank choice: each job takes its file's first row's model (OpenAI and Anthropic
 * lines always name one). */
export async function loadModels() {
  const select = document.getElementById("model");
  const current = select.value;
  const fromRows = select.options.length > 0 && current === "";
  try {
    const { data } = await api.models();
    const options = data.map((m) => h("option", { value: m.id, selected: m.id === current }, m.id));
    options.push(h("option", { value: "", selected: fromRows }, FROM_ROWS));
    fill(select, options);
  } catch (err) {
    setText("model-error", `Could not load models: ${err.message}`);
  }
}

/** Wire the form once; onCreated(batches) runs after a successful upload. */
export function setupUpload(onCreated) {
  document.getElementById("files").addEventListener("change", () => clearErrors());
  document.getElementById("upload-form").addEventListener("submit", (e) => submit(e, onCreated));
}
