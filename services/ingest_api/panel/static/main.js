// The panel's entry point: sign-in with an API key (kept in sessionStorage), sign-out,
// and the views routed by the URL hash: #/jobs, #/jobs/<id>, #/new, #/usage,
// #/workers.

import { api, clearKey, getKey, setKey } from "./api.js";
import { setText } from "./dom.js";
import { setupJob, startJob, stopJob } from "./job.js";
import { setupJobs, startJobs, stopJobs } from "./jobs.js";
import { loadModels, setupUpload } from "./upload.js";
import { setupUsage, startUsage } from "./usage.js";
import { startWorkers, stopWorkers } from "./workers.js";

const VIEWS = ["signin", "jobs", "job", "new", "usage", "workers"];

function show(view) {
  for (const name of VIEWS) {
    document.getElementById(`view-${name}`).hidden = name !== view;
  }
  document.getElementById("nav").hidden = view === "signin";
  for (const link of document.querySelectorAll("[data-nav]")) {
    if (link.dataset.nav === view) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

function flash(message) {
  const el = document.getElementById("flash");
  el.textContent = message;
  el.hidden = !message;
}

function route() {
  stopJobs();
  stopJob();
  stopWorkers();
  if (!getKey()) {
    show("signin");
    document.getElementById("api-key").focus();
    return;
  }
  const hash = location.hash || "#/jobs";
  const job = /^#\/jobs\/([0-9a-f]{32})$/.exec(hash);
  if (job) {
    show("job");
    startJob(job[1]);
    document.title = "Job — Relay Batches";
  } else if (hash === "#/workers") {
    show("workers");
    startWorkers();
    document.title = "Workers — Relay Batches";
  } else if (hash === "#/usage") {
    show("usage");
    startUsage();
    document.title = "Usage — Relay Batches";
  } else if (hash === "#/new") {
    show("new");
    loadModels();
    document.title = "New batch — Relay Batches";
  } else {
    show("jobs");
    startJobs();
    document.title = "Jobs — Relay Batches";
  }
  document.getElementById("main").focus({ preventScroll: true });
}

async function signIn(event) {
  event.preventDefault();
  const input = document.getElementById("api-key");
  const key = input.value.trim();
  setText("api-key-error", "");
  if (!key) {
    setText("api-key-error", "Enter an API key.");
    input.setAttribute("aria-invalid", "true");
    return;
  }
  try {
    await api.models(key); // any /v1 call tells whether the key is good
  } catch (err) {
    setText("api-key-error", err.message);
    input.setAttribute("aria-invalid", "true");
    return;
  }
  input.removeAttribute("aria-invalid");
  input.value = "";
  setKey(key);
  flash("");
  route();
}

function signOut(message = "") {
  clearKey();
  flash(message);
  location.hash = "#/jobs";
  route();
}

function onCreated(batches) {
  const names = batches.map((b) => b.name).join(", ");
  flash(`Created ${batches.length} job${batches.length === 1 ? "" : "s"}: ${names}`);
  location.hash = "#/jobs";
}

document.getElementById("signin-form").addEventListener("submit", signIn);
document.getElementById("sign-out").addEventListener("click", () => signOut());
window.addEventListener("relay:unauthorized", () => {
  if (getKey()) signOut("Your API key was refused; sign in again.");
});
window.addEventListener("relay:deleted", (event) => flash(`Deleted job ${event.detail.name}`));
window.addEventListener("hashchange", () => {
  if (location.hash !== "#/jobs") flash("");
  route();
});
setupJobs();
setupJob();
setupUpload(onCreated);
setupUsage();
route();
