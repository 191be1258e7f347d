// trio-broker's web console: plain JS, no dependencies. Pages are hash routes
// (#overview, #topics, #topic/NAME, #records/NAME/P, #groups, #group/ID) drawn from
// the read-only JSON under /api/; the live charts poll /api/stats once a second.
"use strict";

const main = document.getElementById("main");
const HISTORY = 60; // samples kept for the charts (one a second)
const samples = []; // {time, messages_in, bytes_in, bytes_out, apis}
let overview = null;

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;",
  })[c]);
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}

async function api(path, options) {
  const response = await fetch("/api/" + path, options);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || body.message || response.statusText);
  return body;
}

function table(headers, rows, id) {
  const head = headers.map((h) => `<th>${esc(h)}</th>`).join("");
  const body = rows.map((r) => `<tr>${r.join("")}</tr>`).join("");
  return `<table id="${id}"><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
}

const td = (v) => `<td>${esc(v)}</td>`;
const num = (v) => `<td class="num">${esc(v ?? "–")}</td>`;
const link = (href, text) => `<td><a href="${esc(href)}">${esc(text)}</a></td>`;

// ------------------------------------------------------------------ live charts

function rates() {
  const out = { messages: [], bytesOut: [], produceMs: [], fetchMs: [] };
  for (let i = 1; i < samples.length; i += 1) {
    const a = samples[i - 1], b = samples[i];
    const dt = Math.max(b.time - a.time, 1e-3);
    out.messages.push((b.messages_in - a.messages_in) / dt);
    out.bytesOut.push((b.bytes_out - a.bytes_out) / dt);
    for (const [api, key] of [["produce", "produceMs"], ["fetch", "fetchMs"]]) {
      const x = a.apis[api] || { count: 0, seconds: 0 };
      const y = b.apis[api] || { count: 0, seconds: 0 };
      const n = y.count - x.count;
      out[key].push(n > 0 ? (1000 * (y.seconds - x.seconds)) / n : 0);
    }
  }
  return out;
}

function chart(id, title, series, unit) {
  const w = 420, h = 150, pad = 30;
  const all = series.flatMap((s) => s.values);
  const top = Math.max(1e-9, ...all) * 1.1;
  const lines = series.map((s) => {
    const points = s.values.map((v, i) => {
      const x = pad + ((w - pad - 5) * i) / Math.max(HISTORY - 2, 1);
      const y = h - pad / 2 - ((h - pad) * v) / top;
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    }).join(" ");
    return `<polyline fill="none" stroke="${s.color}" stroke-width="2" points="${points}"/>`;
  }).join("");
  const last = series.map((s) =>
    `<span style="color:${s.color}">${esc(s.name)}: ${(s.values.at(-1) ?? 0).toFixed(1)} ${unit}</span>`,
  ).join("");
  return `<div class="chart" id="${id}" data-samples="${series[0].values.length}">
    <svg width="${w}" height="${h}" role="img" aria-label="${esc(title)}">
      <text x="${pad}" y="12">${esc(title)} (max ${top.toFixed(1)} ${unit})</text>
      <line x1="${pad}" y1="${h - pad / 2}" x2="${w}" y2="${h - pad / 2}" stroke="#c8ced6"/>
      ${lines}
    </svg><div class="legend">${last}</div></div>`;
}

function drawCharts() {
  const box = document.getElementById("charts");
  if (!box) return;
  const r = rates();
  box.innerHTML =
    chart("chart-rates", "produced messages/s", [
      { name: "in", color: "#2f6fdb", values: r.messages }], "msg/s") +
    chart("chart-out", "fetched bytes/s", [
      { name: "out", color: "#1e8a5a", values: r.bytesOut }], "B/s") +
    chart("chart-latency", "request latency", [
      { name: "produce", color: "#2f6fdb", values: r.produceMs },
      { name: "fetch", color: "#d9822b", values: r.fetchMs }], "ms");
}

async function poll() {
  try {
    samples.push(await api("stats"));
    while (samples.length > HISTORY) samples.shift();
    drawCharts();
  } catch (e) { /* the broker may be restarting: keep polling */ }
  setTimeout(poll, 1000);
}

// ------------------------------------------------------------------ pages

async function showOverview() {
  overview = await api("overview");
  document.getElementById("cluster").textContent =
    `cluster ${overview.cluster_id} · node ${overview.node_id}`;
  const rows = overview.brokers.map((b) =>
    [num(b.id), td(`${b.host}:${b.port}`), td(b.rack ?? ""), td(b.state)]);
  main.innerHTML = `<h2>Brokers</h2>${table(["id", "address", "rack", "state"], rows, "brokers")}
    <h2>Live</h2><div id="charts"></div>`;
  drawCharts();
}

async function showTopics(offset) {
  const page = await api(`topics?offset=${offset}&limit=50`);
  const rows = page.topics.map((t) => [
    link(`#topic/${encodeURIComponent(t.name)}`, t.name), num(t.partitions),
    num(t.replication_factor), num(t.under_replicated), num(bytes(t.size_bytes)),
    td(t.internal ? "internal" : ""),
  ]);
  const next = offset + page.limit < page.total
    ? `<a href="#topics/${offset + page.limit}">next</a>` : "";
  const prev = offset > 0 ? `<a href="#topics/${Math.max(0, offset - page.limit)}">previous</a>` : "";
  main.innerHTML = `<h2>Topics (${page.total})</h2>
    ${createForm()}
    ${table(["topic", "partitions", "replicas", "under-replicated", "size", ""], rows, "topics")}
    <p class="pager">${prev}${next}</p>`;
  const form = document.getElementById("create-topic");
  if (form) form.addEventListener("submit", createTopic);
}

function createForm() {
  if (!overview || !overview.writes_enabled) {
    return `<p class="muted">Creating and deleting topics is off (console.writes.enable).</p>`;
  }
  return `<form id="create-topic">
    <input name="name" id="new-topic-name" placeholder="topic name" required>
    <input name="partitions" id="new-topic-partitions" type="number" min="1" value="1" style="width:5em">
    <button type="submit" id="create-topic-button">Create topic</button>
    <span id="create-result"></span></form>`;
}

async function createTopic(event) {
  event.preventDefault();
  const form = event.target;
  const result = document.getElementById("create-result");
  try {
    await api("topics", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ name: form.name.value, partitions: Number(form.partitions.value) }),
    });
    result.textContent = `created ${form.name.value}`;
    result.className = "created";
    await showTopics(0);
    document.getElementById("create-result").textContent = `created ${form.name.value}`;
  } catch (e) {
    result.textContent = e.message;
    result.className = "error";
  }
}

async function deleteTopic(name) {
  if (!confirm(`Delete topic ${name}?`)) return;
  try {
    await api(`topics/${encodeURIComponent(name)}`, { method: "DELETE" });
    location.hash = "#topics";
  } catch (e) {
    alert(e.message);
  }
}

async function showTopic(name) {
  const t = await api(`topics/${encodeURIComponent(name)}`);
  const rows = t.partitions.map((p) => [
    link(`#records/${encodeURIComponent(name)}/${p.partition}`, p.partition), num(p.leader),
    td(p.replicas.join(",")), td(p.isr.join(",")), num(p.start_offset), num(p.end_offset),
    num(bytes(p.size_bytes)),
  ]);
  const configs = t.configs.map((c) => [td(c.name), td(c.value), td(c.default ? "default" : "set")]);
  const del = overview && overview.writes_enabled
    ? `<button id="delete-topic">Delete topic</button>` : "";
  main.innerHTML = `<h2>Topic ${esc(t.name)} ${del}</h2>
    <p class="muted">id ${esc(t.topic_id)} · ${t.partition_count} partitions</p>
    ${table(["partition", "leader", "replicas", "ISR", "start", "end", "size"], rows, "partitions")}
    <h2>Configs</h2>${t.configs_error ? `<p class="error">${esc(t.configs_error)}</p>` : ""}
    ${table(["name", "value", ""], configs, "configs")}`;
  const button = document.getElementById("delete-topic");
  if (button) button.addEventListener("click", () => deleteTopic(name));
}

async function showRecords(name, partition, offset) {
  const path = `topics/${encodeURIComponent(name)}/partitions/${partition}/records`;
  const start = offset ?? 0;
  const page = await api(`${path}?offset=${start}&limit=20`);
  const rows = page.records.map((r) => [
    num(r.offset), td(new Date(r.timestamp).toISOString()), `<td><pre>${esc(r.key ?? "null")}</pre></td>`,
    `<td><pre>${esc(r.value ?? "null")}</pre></td>`,
    td(r.headers.map(([k, v]) => `${k}=${v}`).join(", ")),
  ]);
  const last = page.records.at(-1);
  const base = `#records/${encodeURIComponent(name)}/${partition}`;
  const next = last ? `<a href="${base}/${last.offset + 1}">next</a>` : "";
  main.innerHTML = `<h2>${esc(name)} / partition ${esc(partition)}</h2>
    <p class="muted">offsets ${page.log_start_offset} – ${page.high_watermark}
      ${page.error ? `<span class="error">${esc(page.error)}</span>` : ""}</p>
    <p class="pager"><a href="${base}/${page.log_start_offset}">first</a>${next}</p>
    ${table(["offset", "timestamp", "key", "value", "headers"], rows, "records")}`;
}

async function showGroups(offset) {
  const page = await api(`groups?offset=${offset}&limit=50`);
  const rows = page.groups.map((g) => [
    link(`#group/${encodeURIComponent(g.group_id)}`, g.group_id), td(g.state), td(g.type),
    num(g.partitions), `<td class="num${g.lag ? " lag" : ""}">${g.lag}</td>`,
  ]);
  main.innerHTML = `<h2>Consumer groups (${page.total})</h2>
    ${table(["group", "state", "type", "partitions", "lag"], rows, "groups")}`;
}

async function showGroup(id) {
  const g = await api(`groups/${encodeURIComponent(id)}`);
  const members = g.members.map((mb) => [td(mb.member_id), td(mb.client_id), td(mb.client_host)]);
  // A share group has no committed offsets: its position is the share-partition start offset.
  const position = g.protocol_type === "share" ? "start offset" : "committed";
  const rows = g.partitions.map((p) => [
    td(p.topic), num(p.partition), num(p.committed), num(p.end),
    `<td class="num${p.lag ? " lag" : ""}">${p.lag ?? "–"}</td>`,
  ]);
  main.innerHTML = `<h2>Group ${esc(g.group_id)}</h2>
    <p class="muted">${esc(g.state)} · ${esc(g.protocol_type)} ${esc(g.protocol)}</p>
    <h2>Members</h2>${table(["member", "client id", "host"], members, "members")}
    <h2>Lag</h2>${table(["topic", "partition", position, "end", "lag"], rows, "lag")}`;
}

async function route() {
  const [page, ...rest] = location.hash.slice(1).split("/").map(decodeURIComponent);
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.id === `nav-${page || "overview"}`
      || (a.id === "nav-topics" && ["topic", "records"].includes(page))
      || (a.id === "nav-groups" && page === "group"));
  }
  try {
    if (!overview) overview = await api("overview");
    if (page === "topics") await showTopics(Number(rest[0] || 0));
    else if (page === "topic") await showTopic(rest[0]);
    else if (page === "records") await showRecords(rest[0], rest[1], rest[2]);
    else if (page === "groups") await showGroups(Number(rest[0] || 0));
    else if (page === "group") await showGroup(rest[0]);
    else await showOverview();
  } catch (e) {
    main.innerHTML = `<p class="error">${esc(e.message)}</p>`;
  }
}

window.addEventListener("hashchange", route);
route();
poll();
