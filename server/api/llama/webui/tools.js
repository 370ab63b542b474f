// The server's tools (GET /tools: --tools, MCP servers) on the chat page: offered to the model with
// each request; a call the model makes waits for the user to allow or deny it, runs on POST /tools
// (in the working directory set here, sent as x-tool-cwd), and its result goes back to the model,
// which answers again. Loaded before chat.js, whose helpers (headers, save, generate, ...) it uses.
"use strict";

const TOOLS_ON = "ggserve.toolsOn";
const TOOL_CWD = "ggserve.toolCwd";
let serverTools = []; // GET /tools; empty when the server has none (403) or cannot be asked
let toolRunning = false;

async function loadTools() {
  if (!document.querySelector('meta[name="ggserve-tools"]')) return; // the server has none: GET /tools is 403
  try {
    const res = await fetch("tools", { headers: headers() });
    serverTools = res.ok ? await res.json() : [];
  } catch {
    serverTools = [];
  }
  $("#tools-settings").hidden = !serverTools.length;
  $("#tools-on").checked = toolsOn();
  $("#tool-cwd").value = toolCwd();
  renderMessages();
}

function toolsOn() { return localStorage.getItem(TOOLS_ON) !== "off"; }
function toolCwd() { return localStorage.getItem(TOOL_CWD) || ""; }

function toolDefinitions() {
  return serverTools.length && toolsOn() ? serverTools.map((t) => t.definition) : null;
}

function nameToolCalls(msg) {
  // a call needs an id for its result to point at
  (msg.tool_calls || []).forEach((c, i) => { c.id ||= `call_${Date.now().toString(36)}_${i}`; });
}

function pendingCalls(conv) {
  // the calls of the last assistant message that have no result yet
  const i = conv.messages.findLastIndex((m) => m.role === "assistant");
  const m = conv.messages[i];
  if (!m || m.streaming || m.error || !m.tool_calls?.length) return [];
  const answered = new Set(conv.messages.slice(i + 1).filter((x) => x.role === "tool").map((x) => x.tool_call_id));
  return m.tool_calls.filter((c) => !answered.has(c.id));
}

function renderToolCall(call, conv) {
  let args = call.function?.arguments || "";
  try { args = JSON.stringify(JSON.parse(args), null, 2); } catch { /* partial while streaming */ }
  const pending = !inFlight && pendingCalls(conv).includes(call);
  const box = el("details", { class: `tool${pending ? " pending" : ""}`, open: pending || undefined },
    el("summary", {}, `Tool call: ${call.function?.name || "?"}`), el("pre", {}, args));
  if (pending) {
    box.append(el("div", { class: "actions" },
      el("button", { type: "button", class: "run-tool", disabled: toolRunning || undefined,
        onclick: () => runTool(conv, call, true) }, "Run"),
      el("button", { type: "button", class: "link deny-tool", disabled: toolRunning || undefined,
        onclick: () => runTool(conv, call, false) }, "Deny")));
  }
  return box;
}

function renderToolResult(m) {
  return el("div", { class: "msg tool" }, el("details", { class: "tool result" },
    el("summary", {}, `Tool result: ${m.name || "?"}`), el("pre", {}, m.content)));
}

async function callTool(call) {
  let params;
  try { params = JSON.parse(call.function.arguments || "{}"); } catch { return "Error: the arguments are not valid JSON"; }
  const h = headers();
  if (toolCwd()) h["x-tool-cwd"] = toolCwd();
  try {
    const res = await fetch("tools", { method: "POST", headers: h,
      body: JSON.stringify({ tool: call.function.name, params }) });
    if (!res.ok) return await errorText(res);
    const body = await res.json();
    if (body.error) return `Error: ${body.error}`;
    return body.plain_text_response ?? JSON.stringify(body);
  } catch (e) {
    return `Error: ${e.message}`;
  }
}

async function runTool(conv, call, allowed) {
  if (toolRunning || inFlight) return;
  toolRunning = true;
  renderMessages();
  const content = allowed ? await callTool(call) : "The user denied this tool call.";
  toolRunning = false;
  conv.messages.push({ role: "tool", tool_call_id: call.id, name: call.function.name, content });
  conv.updated = Date.now();
  save();
  if (pendingCalls(conv).length) renderAll();
  else generate(conv); // every call answered: the model goes on
}

function wireToolSettings() {
  $("#tools-on").addEventListener("change", (e) => localStorage.setItem(TOOLS_ON, e.target.checked ? "on" : "off"));
  $("#tool-cwd").addEventListener("change", (e) => localStorage.setItem(TOOL_CWD, e.target.value.trim()));
}
