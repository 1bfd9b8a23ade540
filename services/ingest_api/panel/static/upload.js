// The upload form: files plus every job-level field of POST /v1/batches (model, priority,
// name, webhook, budget, cron, parameters, completion window, metadata), one job per file
// via POST /v1/batches/upload. Before anything is sent each CSV file shows the column its
// prompts come from (a header row of several columns: the prompt and id columns to use,
// and the file goes up as Relay JSONL). An error names a field (shown under it) or a file
// (shown next to that file).

import { ApiError, api } from "./api.js";
import { MAX_CONVERT_BYTES, PREVIEW_BYTES, csvToJsonl, describeCsv } from "./csv.js";
import { fill, h, setText } from "./dom.js";

// Form fields sent as they are typed (name: the input's id).
const TEXT_FIELDS = {
  model: "model",
  priority: "priority",
  name: "name",
  webhookUrl: "webhook",
  cron: "cron",
  budget_usd: "budget",
  completion_window: "completion-window",
};
// Every field an error can name (name: the input's id); its message goes in #<name>-error.
const FIELD_IDS = {
  ...TEXT_FIELDS,
  temperature: "temperature",
  max_tokens: "max-tokens",
  params: "params",
  metadata: "metadata",
};
const FILE_PARAM = /^file\[(\d+)\]$/;
const FROM_ROWS = "From each file's rows";
const MAX_METADATA_PAIRS = 16;

const previews = { files: [], generation: 0 };

function sizeText(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
}

function quote(text) {
  const one = text.replace(/\s+/g, " ").trim();
  return `“${one.length > 80 ? `${one.slice(0, 79)}…` : one}”`;
}

function rowsText(preview) {
  const n = preview.desc.rows;
  const some = preview.truncated ? `${n}+ rows (the first ${sizeText(PREVIEW_BYTES)} read)` : `${n} rows`;
  return n === 1 && !preview.truncated ? "1 row" : some;
}

function columnSelect(i, kind, preview) {
  const { columns } = preview.desc;
  const label = kind === "prompt" ? "Prompt column" : "ID column";
  const options = columns.map((name, c) =>
    h("option", { value: String(c), selected: preview[kind] === c }, name || `column ${c + 1}`));
  if (kind === "id") options.unshift(h("option", { value: "-1", selected: preview.id < 0 }, "none: row-1, row-2, …"));
  if (kind === "prompt" && preview.prompt < 0) options.unshift(h("option", { value: "-1", selected: true }, "choose…"));
  return h(
    "label",
    {},
    label,
    h("select", {
      id: `${kind}-col-${i}`,
      onchange: (event) => {
        preview[kind] = Number(event.target.value);
        renderFiles();
      },
    }, options),
  );
}

/** The first prompt the file gives with its chosen prompt column, quoted, or null. */
function firstPrompt(preview) {
  const value = preview.desc.sample?.[preview.prompt];
  return value ? `First prompt: ${quote(value)}` : null;
}

/** What the form will do with file i, under its name. */
function previewOf(i) {
  const preview = previews.files[i];
  if (!preview) return null;
  if (preview.kind === "jsonl") return h("p", { class: "csv-preview muted" }, "JSONL: one request per line.");
  const { desc } = preview;
  if (!desc.columns.length) return h("p", { class: "csv-preview error-text" }, "No rows in this file.");
  const first = firstPrompt(preview);
  if (desc.columns.length === 1) {
    const from = desc.header
      ? `column “${desc.columns[0]}” (its header row skipped)`
      : "its only column (no header row)";
    return h(
      "div",
      { class: "csv-preview", dataset: { columns: "1" } },
      h("p", { class: "muted" }, `CSV · prompts from ${from} · ${rowsText(preview)}`),
      first ? h("p", { class: "muted" }, first) : null,
    );
  }
  return h(
    "div",
    { class: "csv-preview", dataset: { columns: String(desc.columns.length) } },
    h("p", { class: "muted" },
      `CSV · ${desc.columns.length} columns: ${desc.columns.join(", ")} · ${rowsText(preview)}`),
    h("div", { class: "cols" }, columnSelect(i, "prompt", preview), columnSelect(i, "id", preview)),
    first ? h("p", { class: "muted" }, first) : null,
    h("p", { class: "muted" }, `Sent as ${jsonlName(preview.name)}: one user message per row.`),
  );
}

function jsonlName(name) {
  return name.replace(/\.csv$/i, ".jsonl");
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
        previewOf(i),
        failed ? h("p", { class: "field-error", role: "alert", id: `file-error-${i}` }, message) : null,
      );
    }),
  );
}

/** Read the start of every chosen CSV file and show what will be used. */
async function readPreviews() {
  const generation = ++previews.generation;
  const files = [...document.getElementById("files").files];
  const read = await Promise.all(files.map(async (file) => {
    if (!/\.csv$/i.test(file.name)) return { kind: "jsonl", name: file.name };
    const truncated = file.size > PREVIEW_BYTES;
    const desc = describeCsv(await file.slice(0, PREVIEW_BYTES).text(), truncated);
    return { kind: "csv", name: file.name, truncated, desc, prompt: desc.prompt, id: desc.id };
  }));
  if (generation !== previews.generation) return;
  previews.files = read;
  renderFiles();
}

function clearErrors() {
  for (const [field, id] of Object.entries(FIELD_IDS)) {
    setText(`${field}-error`, "");
    document.getElementById(id).removeAttribute("aria-invalid");
  }
  setText("file-error", "");
  setText("upload-error", "");
  document.getElementById("files").removeAttribute("aria-invalid");
  renderFiles();
}

/** The form field an error's param names: "params.temperature" is the temperature
 * input, any other "params…" the JSON box, "metadata…" the metadata box. */
function fieldOf(param) {
  if (!param) return null;
  if (FIELD_IDS[param]) return param;
  const [head, sub] = param.split(/[.[\]]/);
  if (head === "params" && (sub === "temperature" || sub === "max_tokens")) return sub;
  return FIELD_IDS[head] ? head : null;
}

function showError(err) {
  const fileMatch = FILE_PARAM.exec(err.param ?? "");
  const field = fieldOf(err.param);
  if (fileMatch) {
    renderFiles(Number(fileMatch[1]), err.message);
    document.getElementById("files").setAttribute("aria-invalid", "true");
  } else if (err.param === "file") {
    setText("file-error", err.message);
    document.getElementById("files").setAttribute("aria-invalid", "true");
  } else if (field) {
    setText(`${field}-error`, err.message);
    const input = document.getElementById(FIELD_IDS[field]);
    input.setAttribute("aria-invalid", "true");
    input.focus();
  } else {
    setText("upload-error", err.message);
  }
}

function value(id) {
  return document.getElementById(id).value.trim();
}

/** The params object of the three parameter inputs, or null when all are blank. */
function paramsOf() {
  let params = {};
  const text = value("params");
  if (text) {
    try {
      params = JSON.parse(text);
    } catch {
      throw new ApiError(400, "invalid_request_error", "Other parameters must be a JSON object.", "params");
    }
    if (params === null || typeof params !== "object" || Array.isArray(params)) {
      throw new ApiError(400, "invalid_request_error", "Other parameters must be a JSON object.", "params");
    }
  }
  const temperature = value("temperature");
  const maxTokens = value("max-tokens");
  if (temperature) params.temperature = Number(temperature);
  if (maxTokens) params.max_tokens = Number(maxTokens);
  return Object.keys(params).length ? params : null;
}

/** The metadata pairs of the key=value lines, or null when blank. */
function metadataOf() {
  const pairs = {};
  const lines = value("metadata").split("\n").map((l) => l.trim()).filter(Boolean);
  for (const [i, line] of lines.entries()) {
    const at = line.indexOf("=");
    if (at <= 0) {
      throw new ApiError(400, "invalid_request_error",
        `Metadata line ${i + 1} must read key=value.`, "metadata");
    }
    pairs[line.slice(0, at).trim()] = line.slice(at + 1).trim();
  }
  if (Object.keys(pairs).length > MAX_METADATA_PAIRS) {
    throw new ApiError(400, "invalid_request_error",
      `At most ${MAX_METADATA_PAIRS} metadata pairs.`, "metadata");
  }
  return lines.length ? pairs : null;
}

/** The file as it is sent: a many-column CSV as Relay JSONL with the chosen columns. */
async function fileToSend(file, i) {
  const preview = previews.files[i];
  if (preview?.kind !== "csv" || preview.desc.columns.length < 2) return [file, file.name];
  if (file.size > MAX_CONVERT_BYTES) {
    throw new ApiError(400, "invalid_request_error",
      `A CSV of several columns is converted in the browser up to ${sizeText(MAX_CONVERT_BYTES)};` +
      " use the CLI (relay batch submit --prompt-column) for a bigger file.", `file[${i}]`);
  }
  if (preview.prompt < 0) {
    throw new ApiError(400, "invalid_request_error", `Choose the prompt column of '${file.name}'.`, `file[${i}]`);
  }
  let lines;
  try {
    lines = csvToJsonl(await file.text(), preview.prompt, preview.id);
  } catch (err) {
    throw new ApiError(400, "invalid_request_error", `'${file.name}' ${err.message}`, `file[${i}]`);
  }
  return [new Blob(lines, { type: "application/x-ndjson" }), jsonlName(file.name)];
}

async function formData() {
  const form = new FormData();
  for (const [field, id] of Object.entries(TEXT_FIELDS)) form.append(field, value(id));
  const params = paramsOf();
  if (params) form.append("params", JSON.stringify(params));
  const metadata = metadataOf();
  if (metadata) form.append("metadata", JSON.stringify(metadata));
  const files = [...document.getElementById("files").files];
  for (const [i, file] of files.entries()) form.append("file", ...(await fileToSend(file, i)));
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
    const created = await api.upload(await formData());
    document.getElementById("upload-form").reset();
    previews.files = [];
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
  document.getElementById("files").addEventListener("change", () => {
    previews.files = [];
    clearErrors();
    readPreviews();
  });
  document.getElementById("upload-form").addEventListener("submit", (e) => submit(e, onCreated));
}
