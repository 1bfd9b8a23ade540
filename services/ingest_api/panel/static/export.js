// Downloading a job's results as JSONL or CSV, built in the browser from the ndjson stream.

import { streamResults } from "./api.js";

const CSV_COLUMNS = ["custom_id", "content", "error"];

// A cell starting with one of these is run as a formula by spreadsheets (OWASP's CSV
// injection guide): such a cell gets a leading single quote, so it is shown as text.
// Spreadsheets skip leading blanks (ASCII and Unicode spaces, \s, and the zero-width
// characters it leaves out) and read the full-width signs as the ASCII ones, so a sign
// behind blanks, or a full-width one, counts too.
const FORMULA_START = /^[\s\u180e\u200b-\u200d\u2060\ufeff]*[=+\-@\t\r\uff1d\uff0b\uff0d\uff20]/;

/** A cell's text with formula-starting text neutralised. */
export function csvText(value) {
  const text = value === null || value === undefined ? "" : String(value);
  return FORMULA_START.test(text) ? `'${text}` : text;
}

/** One CSV field, neutralised, and quoted when it holds a comma, a quote or a line break
 * (RFC 4180). */
export function csvField(value) {
  const text = csvText(value);
  return /[",\r\n]/.test(text) ? `"${text.replaceAll('"', '""')}"` : text;
}

/** One CSV record with CRLF, the RFC 4180 line ending. */
export function csvLine(values) {
  return `${values.map(csvField).join(",")}\r\n`;
}

async function collect(id, format) {
  const parts = format === "csv" ? [csvLine(CSV_COLUMNS)] : [];
  await streamResults(id, (row) => {
    parts.push(
      format === "csv"
        ? csvLine(CSV_COLUMNS.map((c) => row[c]))
        : `${JSON.stringify(row)}\n`,
    );
  });
  return parts;
}

/** Fetch the results and hand them to the browser as a file download. */
export async function downloadResults(id, format) {
  const parts = await collect(id, format);
  const type = format === "csv" ? "text/csv" : "application/x-ndjson";
  const url = URL.createObjectURL(new Blob(parts, { type }));
  const link = document.createElement("a");
  link.href = url;
  link.download = `${id}-results.${format}`;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}
