// CSV in the browser, for the New batch form: the start of a file read to show which
// column the prompts come from before anything is sent, and a file with a header row of
// several columns turned into Relay's JSONL ({"custom_id", "messages"}) with the chosen
// prompt and id columns. RFC 4180: quoted fields may hold commas, doubled quotes and line
// breaks. A one-column file is sent as it is: the server reads it (docs/api/native.md).

export const PREVIEW_BYTES = 64 * 1024; // what is read of a file to show its columns
export const MAX_CONVERT_BYTES = 64 * 1024 * 1024; // a bigger many-column CSV: use the CLI
const PROMPT_NAMES = ["prompt", "text", "input", "question", "content"];
const ID_NAMES = ["custom_id", "id", "row_id", "key"];

/** The records of text: arrays of fields. A blank line is no record. When truncated is
 * true the text was cut off, so its last record (maybe incomplete) is left out. */
export function parseCsv(text, truncated = false) {
  const records = [];
  let record = [];
  let field = "";
  let quoted = false;
  let i = 0;
  const endRecord = () => {
    record.push(field);
    if (record.length > 1 || record[0] !== "") records.push(record);
    record = [];
    field = "";
  };
  while (i < text.length) {
    const c = text[i];
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') {
        field += '"';
        i += 2;
        continue;
      }
      if (c === '"') quoted = false;
      else field += c;
      i += 1;
      continue;
    }
    if (c === '"' && field === "") quoted = true;
    else if (c === ",") {
      record.push(field);
      field = "";
    } else if (c === "\r" || c === "\n") {
      endRecord();
      if (c === "\r" && text[i + 1] === "\n") i += 1;
    } else field += c;
    i += 1;
  }
  if (!truncated && (field !== "" || record.length)) endRecord();
  return records;
}

function find(names, wanted) {
  const lower = names.map((n) => n.trim().toLowerCase());
  for (const w of wanted) {
    const at = lower.indexOf(w);
    if (at >= 0) return at;
  }
  return -1;
}

/**
 * What the form will do with a CSV whose start is text: {columns, header, prompt, id,
 * sample, rows} where columns are the header's names (or "column 1" without one), prompt
 * and id the columns chosen by default (prompt -1: no column is named like a prompt, so
 * none is chosen; id -1: row-1, row-2, …), sample the first record
 * after any header and rows how many records the start holds (a lower bound when more of
 * the file is unread).
 */
export function describeCsv(text, truncated) {
  const records = parseCsv(text, truncated);
  if (!records.length) return { columns: [], header: false, prompt: -1, id: -1, sample: null, rows: 0 };
  const head = records[0];
  if (head.length === 1) {
    const header = head[0].trim().toLowerCase() === "prompt";
    const body = header ? records.slice(1) : records;
    return {
      columns: [header ? head[0] : "column 1"], header, prompt: 0, id: -1,
      sample: body[0] ?? null, rows: body.length,
    };
  }
  const prompt = find(head, PROMPT_NAMES); // -1: none is named like one, the user picks
  const id = find(head, ID_NAMES);
  const body = records.slice(1);
  return { columns: head, header: true, prompt, id, sample: body[0] ?? null, rows: body.length };
}

/** A many-column CSV's text as Relay JSONL lines, the prompt from column prompt and the
 * custom id from column id (or row-1, row-2, … when id is -1). Throws Error naming the
 * line of a record without the prompt column or with an empty prompt. */
export function csvToJsonl(text, prompt, id) {
  const records = parseCsv(text).slice(1);
  return records.map((record, i) => {
    const content = record[prompt];
    if (content === undefined || !content.trim()) {
      throw new Error(`record ${i + 2}: the prompt column is empty`);
    }
    const customId = id >= 0 && record[id]?.trim() ? record[id].trim() : `row-${i + 1}`;
    return `${JSON.stringify({ custom_id: customId, messages: [{ role: "user", content }] })}\n`;
  });
}
