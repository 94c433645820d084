package lockhttp

// pageHTML is the page: rendered once by html/template, which escapes
// every key and owner, then kept up to date by its script, which fetches
// the JSON and writes every value with textContent (never innerHTML), so
// that a key such as <script>…</script> stays text either way.
const pageHTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>locks — tenace</title>
<style nonce="{{.Nonce}}">
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1b1f24; }
h1 { font-size: 1.3em; margin: 0 0 .2em; }
h2 { font-size: 1.05em; margin: 1.4em 0 .4em; }
#status { color: #57606a; margin-bottom: 1em; }
#error { color: #b42318; font-weight: 600; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .3em .7em; border-bottom: 1px solid #d0d7de; vertical-align: top; }
th { cursor: pointer; user-select: none; background: #f6f8fa; white-space: nowrap; }
th[aria-sort=ascending]::after { content: " ▲"; }
th[aria-sort=descending]::after { content: " ▼"; }
td.key { font-family: ui-monospace, monospace; word-break: break-all; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.quoted { color: #8250df; }
.empty { color: #57606a; font-style: italic; }
</style>
</head>
<body>
<h1>Held locks</h1>
<div id="status">{{if .Error}}no answer from the provider: the held keys are unknown{{else}}{{len .Keys}} keys held{{end}}{{if .Prefix}} under <code>{{.Prefix}}</code>{{end}}{{if .Truncated}} (the first {{len .Keys}} only){{end}} · at {{.At.Format "15:04:05"}}</div>
<div id="error">{{.Error}}</div>
<h2>Longest waits</h2>
<ol id="waits">{{range .Waits}}<li><span class="{{if .Quoted}}quoted{{end}}">{{.Key}}</span>: {{.Waiting}} waiting, the oldest for {{.LongestWait}}</li>{{else}}<li class="empty">{{if .Error}}unknown{{else}}nobody waits{{end}}</li>{{end}}</ol>
<h2>Keys</h2>
<table id="keys">
<thead><tr>
<th data-col="key">Key</th><th data-col="owner">Owner</th><th data-col="mode">Mode</th>
<th data-col="age">Held for</th><th data-col="waiting">Waiting</th><th data-col="wait">Longest wait</th>
</tr></thead>
<tbody>{{range .Keys}}<tr><td class="key{{if .Quoted}} quoted{{end}}">{{.Key}}</td><td{{if .OwnersQuoted}} class="quoted"{{end}}>{{.Owners}}</td><td>{{.Mode}}</td><td class="num">{{.Age}}</td><td class="num">{{.Waiting}}</td><td class="num">{{.LongestWait}}</td></tr>{{else}}<tr><td class="empty" colspan="6">{{if .Error}}unknown: no answer from the provider{{else}}no key is held{{end}}</td></tr>{{end}}</tbody>
</table>
<script nonce="{{.Nonce}}">
"use strict";
(function () {
  const refreshMS = {{.RefreshMS}};
  const params = new URLSearchParams(location.search);
  const url = location.pathname + "?format=json" + (params.has("prefix") ? "&prefix=" + encodeURIComponent(params.get("prefix")) : "");
  // failed is set while the provider does not answer: the keys are then
  // unknown, never shown as none held.
  let keys = null, failed = false, sortCol = "key", sortDir = 1;

  function fmt(ms) {
    if (!(ms > 0)) return "—";
    if (ms < 1000) return ms + "ms";
    let s = Math.round(ms / 1000), out = "";
    const h = Math.floor(s / 3600); s -= h * 3600;
    const m = Math.floor(s / 60); s -= m * 60;
    if (h) out += h + "h";
    if (h || m) out += m + "m";
    return out + s + "s";
  }
  function owners(k) { return k.holders.map(h => h.owner).join(", "); }
  function mode(k) {
    if (!k.holders.length || !k.holders[0].shared) return "exclusive";
    const p = k.holders[0].permits;
    return "shared (" + k.holders.length + (p ? " of " + p : "") + ")";
  }
  const value = {
    key: k => k.key, owner: owners, mode: mode,
    age: k => k.held_ms, waiting: k => k.waiting, wait: k => k.longest_wait_ms,
  };
  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
  }
  function render() {
    const cmp = (a, b) => {
      const x = value[sortCol](a), y = value[sortCol](b);
      return (x < y ? -1 : x > y ? 1 : 0) * sortDir;
    };
    const body = document.createElement("tbody");
    for (const k of keys.slice().sort(cmp)) {
      const tr = document.createElement("tr");
      cell(tr, k.key, k.quoted ? "key quoted" : "key");
      cell(tr, owners(k), k.holders.some(h => h.owner_quoted) ? "quoted" : "");
      cell(tr, mode(k));
      cell(tr, fmt(k.held_ms), "num");
      cell(tr, String(k.waiting), "num");
      cell(tr, fmt(k.longest_wait_ms), "num");
      body.appendChild(tr);
    }
    if (!keys.length) {
      const tr = document.createElement("tr");
      cell(tr, failed ? "unknown: no answer from the provider" : "no key is held", "empty");
      tr.firstChild.colSpan = 6;
      body.appendChild(tr);
    }
    const table = document.getElementById("keys");
    table.replaceChild(body, table.tBodies[0]);
    for (const th of table.tHead.rows[0].cells) {
      if (th.dataset.col === sortCol) th.setAttribute("aria-sort", sortDir > 0 ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    }
    const waits = document.getElementById("waits");
    const ol = document.createElement("ol");
    ol.id = "waits";
    const waiting = keys.filter(k => k.waiting > 0).sort((a, b) => b.longest_wait_ms - a.longest_wait_ms).slice(0, 10);
    for (const k of waiting) {
      const li = document.createElement("li");
      const name = document.createElement("span");
      name.textContent = k.key;
      if (k.quoted) name.className = "quoted";
      li.appendChild(name);
      li.appendChild(document.createTextNode(": " + k.waiting + " waiting, the oldest for " + fmt(k.longest_wait_ms)));
      ol.appendChild(li);
    }
    if (!waiting.length) {
      const li = document.createElement("li");
      li.className = "empty";
      li.textContent = failed ? "unknown" : "nobody waits";
      ol.appendChild(li);
    }
    waits.replaceWith(ol);
  }
  async function refresh() {
    try {
      const resp = await fetch(url, { headers: { Accept: "application/json" }, cache: "no-store" });
      const snap = await resp.json();
      document.getElementById("error").textContent = snap.error || "";
      failed = !!snap.error;
      keys = failed ? [] : snap.keys || [];
      const at = new Date(snap.at);
      document.getElementById("status").textContent = (failed ? "no answer from the provider: the held keys are unknown" : keys.length + " keys held") +
        (snap.prefix ? " under " + snap.prefix : "") + (snap.truncated ? " (the first " + keys.length + " only)" : "") +
        " · at " + at.toLocaleTimeString();
    } catch (e) {
      failed = true;
      keys = [];
      document.getElementById("error").textContent = "refresh failed: " + e;
      document.getElementById("status").textContent = "no answer from the page's server: the held keys are unknown";
    }
    render();
    document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
  }
  for (const th of document.querySelectorAll("#keys th")) {
    th.addEventListener("click", () => {
      if (sortCol === th.dataset.col) sortDir = -sortDir;
      else { sortCol = th.dataset.col; sortDir = th.dataset.col === "key" ? 1 : -1; }
      if (keys) render();
    });
  }
  refresh();
  if (refreshMS > 0) setInterval(refresh, refreshMS);
})();
</script>
</body>
</html>
`
