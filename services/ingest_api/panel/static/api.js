// The public API, seen from the browser: the key in sessionStorage, JSON calls with a
// timeout, the native error object (docs/api/index.md) turned into ApiError, and streamed ndjson results.

const KEY_NAME = "relay.apiKey";
const TIMEOUT_MS = 30_000;
const UPLOAD_TIMEOUT_MS = 10 * 60_000;

export class ApiError extends Error {
  constructor(status, type, message, param) {
    super(message);
    this.status = status;
    this.type = type;
    this.param = param ?? null;
  }
}

export function getKey() {
  return sessionStorage.getItem(KEY_NAME);
}

export function setKey(key) {
  sessionStorage.setItem(KEY_NAME, key);
}

export function clearKey() {
  sessionStorage.removeItem(KEY_NAME);
}

function headers(extra = {}, key = getKey()) {
  return { Authorization: `Bearer ${key ?? ""}`, ...extra };
}

async function errorFrom(response) {
  try {
    const body = await response.json();
    const e = body.error ?? {};
    return new ApiError(response.status, e.type, e.message ?? response.statusText, e.param);
  } catch {
    return new ApiError(response.status, "internal_error", `HTTP ${response.status}`, null);
  }
}

/** Any 401 means the key is no longer good: the app listens for this and signs out. */
function checkAuth(error) {
  if (error.status === 401) window.dispatchEvent(new CustomEvent("relay:unauthorized"));
  return error;
}

/** One JSON request (json: a value sent as the JSON body); throws ApiError (or a
 * network/timeout error). */
export async function request(method, path, { body, json, key, timeoutMs = TIMEOUT_MS } = {}) {
  const extra = { Accept: "application/json" };
  if (json !== undefined) {
    extra["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  }
  let response;
  try {
    response = await fetch(path, {
      method,
      body,
      headers: headers(extra, key ?? getKey()),
      signal: AbortSignal.timeout(timeoutMs),
    });
  } catch (err) {
    throw new ApiError(0, "network_error", networkMessage(err), null);
  }
  if (!response.ok) {
    const error = await errorFrom(response);
    throw key ? error : checkAuth(error);
  }
  return response.json();
}

function networkMessage(err) {
  if (err?.name === "TimeoutError") return "the server did not answer in time; try again";
  return "cannot reach the server; check your connection and try again";
}

const batchPath = (id, tail = "") => `/v1/batches/${encodeURIComponent(id)}${tail}`;

export const api = {
  models: (key) => request("GET", "/v1/models", { key }),
  list: (params) => request("GET", `/v1/batches?${new URLSearchParams(params)}`),
  get: (id) => request("GET", batchPath(id)),
  cancel: (id) => request("POST", batchPath(id, "/cancel")),
  remove: (id) => request("DELETE", batchPath(id)),
  pause: (id) => request("POST", batchPath(id, "/pause")),
  resume: (id) => request("POST", batchPath(id, "/resume")),
  retry: (id, rows = "failed") =>
    request("POST", batchPath(id, "/retry"), { json: { rows } }),
  deadLetters: (id, details = false) =>
    request("GET", batchPath(id, details ? "/dead_letter?include=details" : "/dead_letter")),
  stats: (id) => request("GET", batchPath(id, "/stats")),
  deliveries: (id, limit = 100) =>
    request("GET", batchPath(id, `/webhook_deliveries?limit=${limit}`)),
  redeliver: (id) => request("POST", batchPath(id, "/webhook_deliveries")),
  workers: () => request("GET", "/v1/workers"),
  timeline: (id) => request("GET", batchPath(id, "/timeline")),
  usage: (from, to) => request("GET", `/v1/usage?${new URLSearchParams({ from, to })}`),
  upload: (form) =>
    request("POST", "/v1/batches/upload", { body: form, timeoutMs: UPLOAD_TIMEOUT_MS }),
};

/**
 * Stream a job's results as ndjson and call onRow(row, index) for each; stop early when
 * onRow returns false. Memory stays bounded by one network chunk. Options: partial (the
 * rows finished so far, whatever the status) and details (tokens, attempts, deployment,
 * latency, finish reason and cost on every row) and failedOnly (the rows whose outcome is
 * an error, nothing else).
 */
export async function streamResults(
  id,
  onRow,
  { partial = false, details = false, failedOnly = false, timeoutMs = UPLOAD_TIMEOUT_MS } = {},
) {
  const stop = new AbortController();
  const signal = AbortSignal.any([stop.signal, AbortSignal.timeout(timeoutMs)]);
  const params = new URLSearchParams();
  if (partial) params.set("partial", "true");
  if (details) params.set("include", "details");
  if (failedOnly) params.set("outcome", "error");
  const query = params.size ? `?${params}` : "";
  let response;
  try {
    response = await fetch(batchPath(id, `/results${query}`), {
      headers: headers({ Accept: "application/x-ndjson" }),
      signal,
    });
  } catch (err) {
    throw new ApiError(0, "network_error", networkMessage(err), null);
  }
  if (!response.ok) throw checkAuth(await errorFrom(response));
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let index = 0;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let newline;
      while ((newline = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, newline);
        buffer = buffer.slice(newline + 1);
        if (!line.trim()) continue;
        if (onRow(JSON.parse(line), index++) === false) {
          stop.abort();
          return;
        }
      }
    }
  } catch (err) {
    if (stop.signal.aborted) return;
    throw new ApiError(0, "network_error", networkMessage(err), null);
  }
}
