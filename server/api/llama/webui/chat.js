// ggserve chat page. Conversations live in localStorage; answers stream over SSE
// from /v1/chat/completions; Markdown is rendered by the small renderer below,
// which escapes all HTML first. No framework, no build step.
"use strict";

const $ = (sel) => document.querySelector(sel);
const STORE = "ggserve.conversations";
const CURRENT = "ggserve.current";
const API_KEY = "ggserve.apiKey";
const SAMPLING = ["temperature", "top_p", "max_tokens"];

// ---------------------------------------------------------------------------
// Markdown: escape first, then add the few tags we produce ourselves.

function escapeHtml(s) {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function emphasis(s) { // s is escaped already
  return s
    .replace(/\*\*(?=\S)([^*\n]*?\S)\*\*/g, "<strong>$1</strong>")
    .replace(/__(?=\S)([^_\n]*?\S)__/g, "<strong>$1</strong>")
    .replace(/(^|[^*\w])\*(?=\S)([^*\n]*?\S)\*(?!\w)/g, "$1<em>$2</em>")
    .replace(/(^|[^_\w])_(?=\S)([^_\n]*?\S)_(?!\w)/g, "$1<em>$2</em>")
    .replace(/~~(?=\S)([^~\n]*?\S)~~/g, "<del>$1</del>");
}

function inline(text) {
  // code spans and links become placeholders so emphasis never reaches into them
  const held = [];
  const hold = (html) => `\u0000${held.push(html) - 1}\u0000`;
  let s = escapeHtml(text.replace(/\u0000/g, ""));
  s = s.replace(/`([^`\n]+)`/g, (_, code) => hold(`<code>${code}</code>`));
  s = s.replace(/\[([^\]\n]+)\]\(([^()\s]+)\)/g, (m, label, url) =>
    /^(https?:|mailto:)/i.test(url)
      ? hold(`<a href="${url}" target="_blank" rel="noopener noreferrer">${emphasis(label)}</a>`) : m);
  s = emphasis(s);
  while (/\u0000\d+\u0000/.test(s)) s = s.replace(/\u0000(\d+)\u0000/g, (_, i) => held[i]);
  return s;
}

const FENCE = /^\s*(`{3,}|~{3,})\s*([\w+#.-]*)/;
const LIST_ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const HR = /^\s*([-*_])(\s*\1){2,}\s*$/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const TABLE_SEP = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

function startsBlock(lines, i) {
  const l = lines[i];
  return FENCE.test(l) || HEADING.test(l) || HR.test(l) || LIST_ITEM.test(l) || /^\s*>/.test(l) || isTable(lines, i);
}

function isTable(lines, i) {
  return lines[i].includes("|") && i + 1 < lines.length && lines[i + 1].includes("-") && TABLE_SEP.test(lines[i + 1]);
}

function cells(row) {
  return row.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((c) => c.trim());
}

function codeBlock(code, lang) {
  return `<div class="codeblock"><div class="bar"><span class="lang">${escapeHtml(lang)}</span>` +
    `<button type="button" class="copy">Copy</button></div><pre><code>${escapeHtml(code)}</code></pre></div>`;
}

function table(lines, i, out) {
  const head = cells(lines[i]);
  const align = cells(lines[i + 1]).map((c) => (c.endsWith(":") ? (c.startsWith(":") ? "center" : "right") : ""));
  const td = (tag, c, k) => `<${tag}${align[k] ? ` class="${align[k]}"` : ""}>${inline(c)}</${tag}>`;
  let html = `<table><thead><tr>${head.map((c, k) => td("th", c, k)).join("")}</tr></thead><tbody>`;
  for (i += 2; i < lines.length && lines[i].includes("|") && lines[i].trim(); i++) {
    html += `<tr>${cells(lines[i]).slice(0, head.length).map((c, k) => td("td", c, k)).join("")}</tr>`;
  }
  out.push(html + "</tbody></table>");
  return i;
}

function list(lines, i, out) {
  const first = lines[i].match(LIST_ITEM);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const items = [];
  while (i < lines.length) {
    const line = lines[i];
    const m = line.match(LIST_ITEM);
    if (m && m[1].length === indent && /\d/.test(m[2]) === ordered) {
      items.push([m[3]]);
    } else if (m && m[1].length < indent) {
      break;
    } else if (line.trim() === "") {
      const next = lines.slice(i + 1).find((l) => l.trim() !== "");
      const nm = next && next.match(LIST_ITEM);
      if (!next || !(nm ? nm[1].length >= indent : /^\s+/.test(next))) break;
      items[items.length - 1].push("");
    } else if (m || /^\s/.test(line) || !startsBlock(lines, i)) {
      items[items.length - 1].push(line); // a nested list or a continuation line
    } else {
      break;
    }
    i++;
  }
  const tag = ordered ? "ol" : "ul";
  const start = ordered && parseInt(first[2], 10) !== 1 ? ` start="${parseInt(first[2], 10)}"` : "";
  const body = items.map(([head, ...rest]) => {
    const pad = Math.min(...rest.filter((l) => l.trim()).map((l) => l.match(/^\s*/)[0].length));
    const inner = rest.length ? markdown(rest.map((l) => l.slice(Math.min(pad, l.length))).join("\n")) : "";
    return `<li>${inline(head)}${inner}</li>`;
  });
  out.push(`<${tag}${start}>${body.join("")}</${tag}>`);
  return i;
}

function markdown(src) {
  const lines = src.replace(/\r\n?/g, "\n").split("\n");
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if ((m = line.match(FENCE))) {
      const fence = m[1];
      const body = [];
      for (i++; i < lines.length && !lines[i].trim().startsWith(fence); i++) body.push(lines[i]);
      i++; // the closing fence; while an answer streams it may not have arrived yet
      out.push(codeBlock(body.join("\n"), m[2]));
    } else if (line.trim() === "") {
      i++;
    } else if ((m = line.match(HEADING))) {
      out.push(`<h${m[1].length}>${inline(m[2])}</h${m[1].length}>`);
      i++;
    } else if (HR.test(line)) {
      out.push("<hr>");
      i++;
    } else if (isTable(lines, i)) {
      i = table(lines, i, out);
    } else if (/^\s*>/.test(line)) {
      const quoted = [];
      for (; i < lines.length && /^\s*>/.test(lines[i]); i++) quoted.push(lines[i].replace(/^\s*>\s?/, ""));
      out.push(`<blockquote>${markdown(quoted.join("\n"))}</blockquote>`);
    } else if (LIST_ITEM.test(line)) {
      i = list(lines, i, out);
    } else {
      const para = [line];
      for (i++; i < lines.length && lines[i].trim() !== "" && !startsBlock(lines, i); i++) para.push(lines[i]);
      out.push(`<p>${para.map((l) => inline(l.trim())).join("<br>")}</p>`);
    }
  }
  return out.join("");
}

// ---------------------------------------------------------------------------
// State: conversations in localStorage, the server's /props, the request in flight.

let conversations = loadConversations();
let currentId = localStorage.getItem(CURRENT);
let props = null;
let attachments = []; // data: URLs waiting to be sent
let inFlight = null; // {controller, conv, msg}

function loadConversations() {
  try {
    const list = JSON.parse(localStorage.getItem(STORE) || "[]");
    for (const c of list) {
      for (const m of c.messages) {
        if (m.streaming) { m.streaming = false; m.stopped = true; } // the page went away mid-answer
      }
    }
    return Array.isArray(list) ? list : [];
  } catch {
    return [];
  }
}

function save() {
  const write = (list) => localStorage.setItem(STORE, JSON.stringify(list));
  try {
    write(conversations);
  } catch {
    // over the browser's quota: keep the text, drop the images from what is stored
    const slim = conversations.map((c) => ({
      ...c, messages: c.messages.map((m) => (m.images ? { ...m, images: m.images.map(() => null) } : m)),
    }));
    try {
      write(slim);
      notice("Browser storage is full: images are not kept across reloads.");
    } catch (e) {
      notice(`Could not save conversations: ${e.message}`);
    }
  }
  if (currentId) localStorage.setItem(CURRENT, currentId);
}

function newConversation(like = {}) {
  // a new conversation starts with the system prompt and settings of the one it was opened from
  const conv = { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`, title: "",
    updated: Date.now(), system: like.system || "", messages: [] };
  for (const k of SAMPLING) conv[k] = like[k] ?? "";
  conversations.unshift(conv);
  return conv;
}

function current() {
  let conv = conversations.find((c) => c.id === currentId);
  if (!conv) {
    conv = conversations[0] || newConversation();
    currentId = conv.id;
  }
  return conv;
}

function apiKey() { return localStorage.getItem(API_KEY) || ""; }

function headers() {
  const h = { "Content-Type": "application/json" };
  if (apiKey()) h.Authorization = `Bearer ${apiKey()}`;
  return h;
}

async function errorText(res) {
  const text = await res.text();
  let message = text || res.statusText;
  try {
    const body = JSON.parse(text);
    if (body.error) message = body.error.message || JSON.stringify(body.error);
  } catch { /* not JSON: show it as it came */ }
  return `Error ${res.status}: ${message}`;
}

function notice(text) {
  $("#notice").textContent = text;
  $("#notice").hidden = !text;
}

// ---------------------------------------------------------------------------
// Rendering

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : v);
  }
  e.append(...children.filter((c) => c !== null && c !== undefined));
  return e;
}

function renderList() {
  const ul = $("#conversations");
  ul.replaceChildren();
  for (const conv of [...conversations].sort((a, b) => b.updated - a.updated)) {
    const name = el("span", { class: "name", title: conv.title || "New chat" }, conv.title || "New chat");
    const li = el("li", { class: conv.id === currentId ? "current" : "", "data-id": conv.id,
      onclick: () => select(conv.id) }, name,
    el("button", { type: "button", class: "link rename", title: "Rename",
      onclick: (e) => { e.stopPropagation(); rename(li, name, conv); } }, "\u270E"),
    el("button", { type: "button", class: "link delete", title: "Delete",
      onclick: (e) => { e.stopPropagation(); remove(conv); } }, "\u2715"));
    ul.append(li);
  }
}

function rename(li, name, conv) {
  const input = el("input", { value: conv.title || "", "aria-label": "Conversation name" });
  let done = false;
  const finish = (keep) => {
    if (done) return;
    done = true;
    if (keep && input.value.trim()) { conv.title = input.value.trim(); save(); }
    renderList();
    renderHeader();
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") finish(true);
    if (e.key === "Escape") finish(false);
  });
  input.addEventListener("blur", () => finish(true));
  input.addEventListener("click", (e) => e.stopPropagation());
  name.replaceWith(input);
  input.focus();
  input.select();
}

function remove(conv) {
  if (!confirm(`Delete "${conv.title || "New chat"}"?`)) return;
  if (inFlight && inFlight.conv === conv) inFlight.controller.abort();
  conversations = conversations.filter((c) => c !== conv);
  if (currentId === conv.id) currentId = null;
  current();
  save();
  renderAll();
}

function select(id) {
  currentId = id;
  document.body.classList.remove("sidebar-open");
  save();
  renderAll();
}

function splitThink(m) {
  // models whose reasoning the server does not separate write it inside <think> tags
  const match = !m.reasoning && m.content.match(/^\s*<think>([\s\S]*?)(<\/think>|$)/);
  if (!match) return [m.reasoning || "", m.content];
  return [match[1].trim(), m.content.slice(match[0].length)];
}

function statsText(s) {
  const parts = [];
  if (s.completion_tokens !== undefined) parts.push(`${s.completion_tokens} tokens`);
  if (s.tokens_per_second) parts.push(`${s.tokens_per_second.toFixed(1)} tokens/s`);
  if (s.prompt_tokens !== undefined) parts.push(`prompt ${s.prompt_tokens} tokens (${s.cached_tokens || 0} cached)`);
  if (s.ttft_ms !== undefined) parts.push(`first token after ${(s.ttft_ms / 1000).toFixed(2)} s`);
  return parts.join(" \u00b7 ");
}

function renderMessage(m, index, conv) {
  const last = index === conv.messages.length - 1;
  const idle = !inFlight;
  if (m.role === "tool") return renderToolResult(m); // webui/tools.js
  if (m.role === "user") {
    const thumbs = (m.images || []).length
      ? el("div", { class: "thumbs" }, ...m.images.map((url) => (!url ? el("span", { class: "muted" }, "[media not kept]")
        : isAudio(url) ? el("audio", { src: url, controls: "" }) : el("img", { src: url, alt: "attached image" }))))
      : null;
    const lastUser = conv.messages.findLastIndex((x) => x.role === "user") === index;
    return el("div", { class: "msg user" }, thumbs, m.content ? el("div", { class: "bubble" }, m.content) : null,
      lastUser && idle ? el("div", { class: "actions" },
        el("button", { type: "button", class: "link edit", onclick: () => editLast(conv) }, "Edit")) : null);
  }
  const [reasoning, content] = splitThink(m);
  const box = el("div", { class: "msg assistant" });
  if (reasoning) {
    const details = el("details", { class: "think", open: m.showReasoning || undefined,
      ontoggle: (e) => { m.showReasoning = e.target.open; } },
    el("summary", {}, m.streaming && !content ? "Thinking\u2026" : "Reasoning"),
    el("div", { class: "reasoning" }, reasoning));
    box.append(details);
  }
  const body = el("div", { class: `content${m.streaming ? " cursor" : ""}` });
  body.innerHTML = markdown(content);
  box.append(body);
  for (const call of m.tool_calls || []) box.append(renderToolCall(call, conv)); // webui/tools.js
  if (m.error) box.append(el("div", { class: "error", role: "alert" }, m.error));
  const s = m.stats || {};
  const line = [statsText(s), m.stopped ? "stopped" : ""].filter(Boolean).join(" \u00b7 ");
  if (line) {
    box.append(el("div", { class: "stats", "data-prompt-tokens": s.prompt_tokens, "data-cached-tokens": s.cached_tokens,
      "data-completion-tokens": s.completion_tokens }, line));
  }
  if (last && idle) {
    box.append(el("div", { class: "actions" },
      el("button", { type: "button", class: "link regenerate", onclick: () => regenerate(conv) }, "Regenerate")));
  }
  return box;
}

function renderMessages() {
  const conv = current();
  const box = $("#messages");
  box.replaceChildren(...conv.messages.map((m, i) => renderMessage(m, i, conv)));
  box.scrollTop = box.scrollHeight;
}

function renderHeader() {
  const conv = current();
  $("#title").textContent = conv.title || "New chat";
  $("#system").value = conv.system;
  for (const k of SAMPLING) $(`#${k}`).value = conv[k];
  $("#send").hidden = !!inFlight;
  $("#stop").hidden = !inFlight;
}

function renderAll() {
  renderList();
  renderHeader();
  renderMessages();
  renderAttachments();
}

let pendingUpdate = false;
function updateStreaming() {
  // re-render only the answer that is growing, at most every 40 ms
  if (pendingUpdate) return;
  pendingUpdate = true;
  setTimeout(() => {
    pendingUpdate = false;
    if (!inFlight || inFlight.conv !== current()) return;
    const box = $("#messages");
    const stick = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
    const conv = inFlight.conv;
    const i = conv.messages.indexOf(inFlight.msg);
    const old = box.children[i];
    if (old) old.replaceWith(renderMessage(inFlight.msg, i, conv));
    if (stick) box.scrollTop = box.scrollHeight;
  }, 40);
}

function renderAttachments() {
  $("#attachments").replaceChildren(...attachments.map((url, i) => el("div", { class: "att" },
    isAudio(url) ? el("audio", { src: url, controls: "" }) : el("img", { src: url, alt: "image to send" }),
    el("button", { type: "button", title: "Remove", onclick: () => { attachments.splice(i, 1); renderAttachments(); } },
      "\u2715"))));
}

// ---------------------------------------------------------------------------
// Talking to the server

function apiMessages(conv) {
  const out = conv.system.trim() ? [{ role: "system", content: conv.system }] : [];
  const msgs = conv.messages;
  for (let i = 0; i < msgs.length; i++) {
    const m = msgs[i];
    const next = msgs[i + 1];
    // an exchange that failed is shown but not sent again: roles keep alternating
    if (m.role === "user" && next && next.role === "assistant" && next.error && !next.content) { i++; continue; }
    if (m.role === "user") {
      const images = (m.images || []).filter(Boolean);
      out.push({ role: "user", content: images.length
        ? [...images.map((url) => (isAudio(url) ? { type: "input_audio", input_audio: audioPart(url) }
          : { type: "image_url", image_url: { url } })),
          ...(m.content ? [{ type: "text", text: m.content }] : [])]
        : m.content });
    } else if (m.role === "tool") {
      out.push({ role: "tool", tool_call_id: m.tool_call_id, content: m.content });
    } else if (!m.streaming) {
      out.push({ role: "assistant", content: m.content, ...(m.tool_calls?.length ? { tool_calls: m.tool_calls } : {}) });
    }
  }
  return out;
}

async function readEvents(res, onEvent) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let end;
    while ((end = buf.search(/\r?\n\r?\n/)) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(end).replace(/^\r?\n\r?\n/, "");
      const data = block.split(/\r?\n/).filter((l) => /^(data|error):/.test(l))
        .map((l) => l.replace(/^(data|error):\s?/, "")).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      onEvent(JSON.parse(data));
    }
  }
}

function applyChunk(msg, chunk, clock) {
  if (chunk.error) {
    msg.error = `Error: ${chunk.error.message || JSON.stringify(chunk.error)}`;
    return;
  }
  const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
  if (delta) {
    if (delta.content || delta.reasoning_content) clock.first ??= performance.now();
    if (delta.content) msg.content += delta.content;
    if (delta.reasoning_content) msg.reasoning = (msg.reasoning || "") + delta.reasoning_content;
    for (const t of delta.tool_calls || []) {
      msg.tool_calls ??= [];
      const call = (msg.tool_calls[t.index ?? 0] ??= { id: "", type: "function", function: { name: "", arguments: "" } });
      if (t.id) call.id = t.id;
      if (t.function?.name) call.function.name += t.function.name;
      if (t.function?.arguments) call.function.arguments += t.function.arguments;
    }
  }
  if (chunk.choices && chunk.choices[0] && chunk.choices[0].finish_reason) msg.finish = chunk.choices[0].finish_reason;
  if (chunk.usage) {
    msg.stats = { prompt_tokens: chunk.usage.prompt_tokens, completion_tokens: chunk.usage.completion_tokens,
      cached_tokens: chunk.usage.prompt_tokens_details?.cached_tokens ?? 0 };
  }
}

async function generate(conv) {
  const msg = { role: "assistant", content: "", reasoning: "", streaming: true };
  const body = { messages: apiMessages(conv), stream: true, stream_options: { include_usage: true } };
  for (const k of SAMPLING) if (conv[k] !== "" && conv[k] !== null && !Number.isNaN(Number(conv[k]))) body[k] = Number(conv[k]);
  const tools = toolDefinitions(); // webui/tools.js: the server's tools, when it has any
  if (tools) body.tools = tools;
  conv.messages.push(msg);
  conv.updated = Date.now();
  inFlight = { controller: new AbortController(), conv, msg };
  renderAll();
  const clock = { start: performance.now(), first: null };
  let lastSave = 0;
  try {
    const res = await fetch("v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body),
      signal: inFlight.controller.signal });
    if (!res.ok) {
      msg.error = await errorText(res);
    } else {
      await readEvents(res, (chunk) => {
        applyChunk(msg, chunk, clock);
        updateStreaming();
        if (performance.now() - lastSave > 1000) { lastSave = performance.now(); save(); }
      });
    }
  } catch (e) {
    if (e.name === "AbortError") msg.stopped = true;
    else msg.error = `Error: ${e.message}`;
  }
  const end = performance.now();
  if (msg.stats && clock.first !== null) {
    msg.stats.ttft_ms = clock.first - clock.start;
    const n = msg.stats.completion_tokens;
    if (n > 1 && end > clock.first) msg.stats.tokens_per_second = (n - 1) / ((end - clock.first) / 1000);
  }
  msg.streaming = false;
  nameToolCalls(msg);
  inFlight = null;
  save();
  if (conversations.includes(conv) && conv === current()) renderAll();
  else renderList();
}

function send() {
  if (inFlight) return;
  const text = $("#input").value.trim();
  if (!text && !attachments.length) return;
  const conv = current();
  conv.messages.push({ role: "user", content: text, images: attachments });
  if (!conv.title) conv.title = (text || "Image").replace(/\s+/g, " ").slice(0, 48);
  attachments = [];
  $("#input").value = "";
  autosize();
  generate(conv);
}

function regenerate(conv) {
  if (inFlight) return;
  if (conv.messages.at(-1)?.role === "assistant") conv.messages.pop();
  generate(conv);
}

function editLast(conv) {
  if (inFlight) return;
  const i = conv.messages.findLastIndex((m) => m.role === "user");
  const m = conv.messages[i];
  conv.messages.splice(i);
  $("#input").value = m.content;
  attachments = (m.images || []).filter(Boolean);
  save();
  renderAll();
  autosize();
  $("#input").focus();
}

async function loadProps() {
  try {
    const res = await fetch("props", { headers: headers() });
    if (res.status === 503) {
      notice("The model is loading\u2026");
      setTimeout(loadProps, 1000);
      return;
    }
    if (!res.ok) {
      const err = await errorText(res);
      notice(res.status === 401 ? `${err}. Enter the API key in Settings.` : err);
      if (res.status === 401) toggleSettings(true);
      return;
    }
    props = await res.json();
    notice("");
    loadTools();
    $("#model").textContent = props.model_alias || props.model_path.split("/").pop();
    const defaults = props.default_generation_settings?.params || {};
    $("#temperature").placeholder = defaults.temperature ?? "";
    $("#top_p").placeholder = defaults.top_p ?? "";
    $("#max_tokens").placeholder = "no limit";
    const vision = !!props.modalities?.vision;
    const audio = !!props.modalities?.audio;
    $("#attach").classList.toggle("disabled", !vision && !audio);
    $("#attach").title = vision && audio ? "Attach images or audio" : vision ? "Attach images"
      : audio ? "Attach audio (WAV, MP3, FLAC)" : "This model does not take images or audio";
    $("#record").hidden = !audio || !navigator.mediaDevices?.getUserMedia;
  } catch (e) {
    notice(`Cannot reach the server: ${e.message}`);
    setTimeout(loadProps, 3000);
  }
}

// ---------------------------------------------------------------------------
// Images: picker, paste, drag and drop

function canTakeImages() {
  if (props && props.modalities && props.modalities.vision) return true;
  notice(props ? "This server does not take images (start it with --mmproj)."
    : "The server's capabilities are not known yet.");
  return false;
}

function readAsDataURL(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(r.result);
    r.onerror = () => reject(r.error);
    r.readAsDataURL(file);
  });
}

function canTakeAudio() {
  if (props && props.modalities && props.modalities.audio) return true;
  notice(props ? "This server does not take audio (start it with an --mmproj that has an audio encoder)."
    : "The server's capabilities are not known yet.");
  return false;
}

async function addFiles(files) {
  const images = [...files].filter((f) => f.type.startsWith("image/"));
  const clips = [...files].filter((f) => f.type.startsWith("audio/"));
  if (images.length && canTakeImages()) for (const f of images) attachments.push(await readAsDataURL(f));
  if (clips.length && canTakeAudio()) for (const f of clips) attachments.push(await readAsDataURL(f));
  renderAttachments();
}

// ---------------------------------------------------------------------------
// Audio: clips as data: URLs (input_audio parts), and recording from the microphone

const isAudio = (url) => url.startsWith("data:audio/");

function audioPart(url) {
  const [head, data] = url.split(",", 2);
  const mime = head.slice(5).split(";")[0];
  const format = /flac/.test(mime) ? "flac" : /mp3|mpeg/.test(mime) ? "mp3" : "wav";
  return { data, format };
}

function wavDataURL(samples, rate) {
  // 16-bit PCM mono: a format every audio mmproj's decoder takes (MediaRecorder gives webm/ogg)
  const buf = new DataView(new ArrayBuffer(44 + samples.length * 2));
  const text = (o, s) => [...s].forEach((c, i) => buf.setUint8(o + i, c.charCodeAt(0)));
  text(0, "RIFF"); buf.setUint32(4, 36 + samples.length * 2, true); text(8, "WAVEfmt ");
  buf.setUint32(16, 16, true); buf.setUint16(20, 1, true); buf.setUint16(22, 1, true);
  buf.setUint32(24, rate, true); buf.setUint32(28, rate * 2, true); buf.setUint16(32, 2, true);
  buf.setUint16(34, 16, true); text(36, "data"); buf.setUint32(40, samples.length * 2, true);
  samples.forEach((x, i) => buf.setInt16(44 + i * 2, Math.max(-1, Math.min(1, x)) * 0x7fff, true));
  let bin = "";
  const bytes = new Uint8Array(buf.buffer);
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return `data:audio/wav;base64,${btoa(bin)}`;
}

let recorder = null;

async function toggleRecording() {
  if (recorder) { recorder.stop(); return; }
  if (!canTakeAudio()) return;
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (e) {
    notice(`No microphone: ${e.message}`);
    return;
  }
  const chunks = [];
  recorder = new MediaRecorder(stream);
  recorder.ondataavailable = (e) => chunks.push(e.data);
  recorder.onstop = async () => {
    stream.getTracks().forEach((t) => t.stop());
    recorder = null;
    $("#record").textContent = "Record";
    const ctx = new AudioContext();
    try {
      const audio = await ctx.decodeAudioData(await new Blob(chunks).arrayBuffer());
      attachments.push(wavDataURL(audio.getChannelData(0), audio.sampleRate));
      renderAttachments();
    } catch (e) {
      notice(`Could not read the recording: ${e.message}`);
    } finally {
      ctx.close();
    }
  };
  recorder.start();
  $("#record").textContent = "Stop recording";
}

// ---------------------------------------------------------------------------
// Wiring

function toggleSettings(open) {
  const form = $("#settings");
  form.hidden = open === undefined ? !form.hidden : !open;
  $("#toggle-settings").setAttribute("aria-expanded", String(!form.hidden));
}

function autosize() {
  const t = $("#input");
  t.style.height = "auto";
  t.style.height = `${Math.min(t.scrollHeight + 2, window.innerHeight * 0.4)}px`;
}

function copyCode(button) {
  const code = button.closest(".codeblock").querySelector("code").textContent;
  const done = () => { button.textContent = "Copied"; setTimeout(() => { button.textContent = "Copy"; }, 1200); };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(code).then(done, () => notice("Copy failed"));
  } else { // plain http on another host: no clipboard API
    const t = el("textarea", {}, code);
    document.body.append(t);
    t.select();
    document.execCommand("copy");
    t.remove();
    done();
  }
}

function init() {
  $("#composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("#input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  $("#input").addEventListener("input", autosize);
  $("#input").addEventListener("paste", (e) => {
    const files = [...(e.clipboardData?.files || [])];
    if (files.some((f) => f.type.startsWith("image/"))) { e.preventDefault(); addFiles(files); }
  });
  $("#stop").addEventListener("click", () => inFlight && inFlight.controller.abort());
  $("#attach").addEventListener("click", (e) => {
    if (e.target !== $("#file") && !props?.modalities?.audio && !canTakeImages()) e.preventDefault();
  });
  $("#file").addEventListener("change", (e) => { addFiles(e.target.files); e.target.value = ""; });
  $("#record").addEventListener("click", toggleRecording);
  document.addEventListener("dragover", (e) => {
    if (![...e.dataTransfer.types].includes("Files")) return;
    e.preventDefault();
    document.body.classList.add("dragging");
  });
  document.addEventListener("dragleave", (e) => { if (!e.relatedTarget) document.body.classList.remove("dragging"); });
  document.addEventListener("drop", (e) => {
    document.body.classList.remove("dragging");
    if (!e.dataTransfer.files.length) return;
    e.preventDefault();
    addFiles(e.dataTransfer.files);
  });
  $("#messages").addEventListener("click", (e) => { if (e.target.classList.contains("copy")) copyCode(e.target); });
  $("#new-chat").addEventListener("click", () => {
    const conv = current().messages.length ? newConversation(current()) : current();
    select(conv.id);
    $("#input").focus();
  });
  $("#toggle-sidebar").addEventListener("click", (e) => {
    e.stopPropagation();
    document.body.classList.toggle("sidebar-open");
  });
  $("#main").addEventListener("click", () => document.body.classList.remove("sidebar-open")); // the drawer closes
  $("#toggle-settings").addEventListener("click", () => toggleSettings());
  $("#system").addEventListener("input", (e) => { current().system = e.target.value; save(); });
  for (const k of SAMPLING) $(`#${k}`).addEventListener("input", (e) => { current()[k] = e.target.value; save(); });
  $("#api-key").value = apiKey();
  wireToolSettings();
  $("#api-key").addEventListener("change", (e) => {
    localStorage.setItem(API_KEY, e.target.value.trim());
    loadProps();
  });
  window.addEventListener("storage", (e) => { // another tab changed the conversations
    if (e.key === STORE && !inFlight) { conversations = loadConversations(); renderAll(); }
  });
  current();
  save();
  renderAll();
  loadProps();
  $("#input").focus();
}

init();
