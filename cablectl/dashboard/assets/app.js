// The Cablemesh dashboard: draws the document of GET /api/v1/mesh, sent whole on the server-sent
// event stream /api/v1/stream at once and after every change. Plain DOM: no framework, nothing
// loaded from anywhere but this server. Every text from the broker goes in as textContent.
"use strict";

let mesh = null;

// el builds an element: el("td", {class: "x", title: "y"}, "text", childNode, ...).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function svgEl(tag, attrs, ...children) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function table(headers, rows) {
  if (rows.length === 0) return el("p", {class: "muted"}, "none");
  return el("table", {}, el("thead", {}, el("tr", {}, headers.map(h => el("th", {}, h)))), el("tbody", {}, rows));
}

function ms(v) { return v === null || v === undefined ? "" : (v < 10 ? v.toFixed(2) : v.toFixed(1)) + " ms"; }
function pairName(p) { return p.clusters[0] + " – " + p.clusters[1]; }
function age(t) {
  if (!t) return "-";
  const s = Math.max(0, Math.round((Date.now() - new Date(t).getTime()) / 1000));
  if (s < 120) return s + "s ago";
  if (s < 7200) return Math.round(s / 60) + "m ago";
  return Math.round(s / 3600) + "h ago";
}
function pill(text, cls) { return el("span", {class: "pill " + (cls || "")}, text); }
function replace(id, node) { const c = document.getElementById(id); c.replaceChildren(node); }

// ---- mesh page

function renderSummary(m) {
  const count = s => m.pairs.filter(p => p.state === s).length;
  const connectable = m.pairs.filter(p => p.state !== "none").length;
  const gw = m.clusters.reduce((a, c) => [a[0] + c.gatewaysOnline, a[1] + c.gatewaysTotal], [0, 0]);
  const card = (n, label, id) => el("div", {class: "card", id: id}, el("b", {}, n), el("span", {}, label));
  replace("mesh-summary", el("div", {class: "summary"},
    card(m.clusters.length, "clusters", "sum-clusters"),
    card(count("connected") + " / " + connectable, "pairs connected", "sum-connected"),
    card(count("down"), "pairs down", "sum-down"),
    card(count("degraded"), "pairs degraded", "sum-degraded"),
    card(gw[0] + " / " + gw[1], "gateways online", "sum-gateways"),
    card(m.services.length, "services", "sum-services")));
}

function renderMatrix(m) {
  const names = m.clusters.map(c => c.name);
  const byPair = new Map(m.pairs.map(p => [p.clusters[0] + "|" + p.clusters[1], p]));
  const head = el("tr", {}, el("th", {}), names.map(n => el("th", {}, n)));
  const rows = names.map(a => el("tr", {}, el("th", {}, a), names.map(b => {
    if (a === b) return el("td", {class: "cell self"}, "—");
    const p = byPair.get(a < b ? a + "|" + b : b + "|" + a);
    if (!p) return el("td", {class: "cell state-unknown"}, "?");
    const tip = [pairName(p) + ": " + p.state, p.reason, p.policy ? "policy " + p.policy : "",
      p.nodes ? "gateways " + p.nodes.join(", ") : "", p.latencyP99Ms != null ? "p99 " + ms(p.latencyP99Ms) : ""].filter(Boolean).join("\n");
    return el("td", {class: "cell state-" + p.state, "data-pair": p.clusters.join("|"), "data-state": p.state, title: tip},
      el("span", {class: "drv"}, p.state === "none" ? "no connection" : (p.driver || "-")),
      p.state === "none" ? "" : (p.state === "connected" && p.latencyP50Ms != null ? ms(p.latencyP50Ms) : p.state));
  })));
  replace("matrix", el("table", {class: "matrix"}, el("thead", {}, head), el("tbody", {}, rows)));
}

function renderGraph(m) {
  const n = m.clusters.length, size = 380, r = n > 1 ? 140 : 0, c = size / 2;
  const pos = new Map(m.clusters.map((cl, i) => {
    const a = -Math.PI / 2 + 2 * Math.PI * i / Math.max(n, 1);
    return [cl.name, [c + r * Math.cos(a), c + r * Math.sin(a)]];
  }));
  const svg = svgEl("svg", {viewBox: `0 0 ${size} ${size}`, width: size, height: size, role: "img", "aria-label": "mesh graph"});
  for (const p of m.pairs) {
    const [x1, y1] = pos.get(p.clusters[0]) || [c, c], [x2, y2] = pos.get(p.clusters[1]) || [c, c];
    const line = svgEl("line", {x1, y1, x2, y2, class: "edge state-" + p.state, "data-pair": p.clusters.join("|"), "data-state": p.state});
    line.append(svgEl("title", {}, pairName(p) + ": " + p.state + " (" + p.reason + ")"));
    svg.append(line);
    if (p.state !== "none") {
      svg.append(svgEl("text", {x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 6, class: "edge-label"},
        (p.driver || "") + " " + (p.state === "connected" && p.latencyP50Ms != null ? ms(p.latencyP50Ms) : p.state)));
    }
  }
  for (const cl of m.clusters) {
    const [x, y] = pos.get(cl.name);
    const g = svgEl("g", {class: "node" + (cl.gatewaysOnline === 0 ? " offline" : ""), "data-cluster": cl.name});
    g.append(svgEl("circle", {cx: x, cy: y, r: 30}), svgEl("text", {x, y}, cl.name),
      svgEl("text", {x, y: y + 44, class: "sub"}, cl.gatewaysOnline + "/" + cl.gatewaysTotal + " gw"));
    svg.append(g);
  }
  replace("graph", svg);
}

function renderLinks(m) {
  const rows = m.links.map(l => el("tr", {"data-pair": l.clusters.join("|")},
    el("td", {}, l.clusters.join(" – ")),
    el("td", {}, l.ends.map(e => el("div", {},
      el("b", {}, e.cluster), " ", e.node ? "(" + e.node + ") " : "", pill(e.state || "?", e.state), " ",
      e.driver || "", " ", e.latencyP50Ms != null ? "p50 " + ms(e.latencyP50Ms) + " p99 " + ms(e.latencyP99Ms) : "",
      el("span", {class: "muted"}, " reported " + age(e.reportedAt) + (e.agentVersion ? ", agent " + e.agentVersion : ""))))),
    el("td", {}, l.agree ? el("span", {class: "ok"}, "yes") : el("span", {class: "warn"}, "no")),
    el("td", {}, l.stale ? el("span", {class: "warn"}, "stale") : "fresh")));
  replace("links", table(["Pair", "Ends", "Agree", "Reports"], rows));
}

// ---- clusters

function renderClusters(m) {
  replace("mesh-warnings", m.warnings.length ? el("div", {class: "panel warn"}, m.warnings.map(w => el("div", {}, "⚠ " + w))) : el("div"));
  const rows = m.clusters.map(c => el("tr", {"data-cluster": c.name},
    el("td", {}, el("b", {}, c.name)), el("td", {}, c.id), el("td", {}, c.mode),
    el("td", {}, Object.entries(c.labels).map(([k, v]) => pill(k + "=" + v))),
    el("td", {class: c.gatewaysOnline === 0 ? "warn" : ""}, c.gatewaysOnline + " / " + c.gatewaysTotal,
      el("div", {class: "muted"}, c.gateways.map(g => g.node + (g.online ? "" : " (offline)") + (g.privateIP ? " " + g.privateIP : "")).join(", "))),
    el("td", {}, c.agentVersions.length ? c.agentVersions.join(", ") : el("span", {class: "muted"}, "not reported")),
    el("td", {}, c.certWarnings.length ? c.certWarnings.map(w => el("div", {class: "warn"}, w)) : el("span", {class: "ok"}, "ok"))));
  replace("clusters", table(["Name", "ID", "Mode", "Labels", "Gateways online", "Agent versions", "Certificates"], rows));
}

// ---- policies

function outcomeList(list, truncated, what) {
  if (list.length === 0) return el("span", {class: "muted"}, "none");
  const items = list.map(o => el("div", {}, o.clusters.join(" – "), " ",
    el("span", {class: "muted"}, what === "decides" ? (o.connect ? "connect " + (o.driver || "") : "no connection") : o.outcome + (o.winner ? " (to " + o.winner + ")" : ""))));
  if (truncated) items.push(el("div", {class: "muted"}, "… (the first " + list.length + ")"));
  return list.length > 6 ? el("details", {}, el("summary", {}, list.length + " pairs"), items) : el("div", {}, items);
}

function renderPolicies(m) {
  const rows = m.policies.map(p => {
    const s = p.spec, connects = s.connectionPolicy !== "no-connect";
    const driver = connects ? (s.cableDriver ? s.cableDriver.name : "<default>") : "-";
    return el("tr", {"data-policy": p.name},
      el("td", {}, el("b", {}, p.name), p.isDefault ? el("div", {class: "muted"}, "mesh default") : ""),
      el("td", {}, p.origin), el("td", {}, p.priority), el("td", {}, connects ? "connect" : "no-connect", s.final ? " (final)" : ""),
      el("td", {}, driver), el("td", {}, s.topology || ""),
      el("td", {}, p.status.pairsDecided + " decided, " + p.status.pairsConnected + " connected, " + p.status.conflictsLost + " lost",
        p.status.error ? el("div", {class: "warn"}, p.status.error) : ""),
      el("td", {}, outcomeList(p.decides, p.truncated, "decides")),
      el("td", {}, outcomeList(p.loses, p.truncated, "loses")));
  });
  replace("policies", table(["Policy", "Origin", "Priority", "Connection", "Driver", "Topology", "Status", "Decides", "Covers but loses"], rows));
}

// ---- services

function renderServices(m) {
  const rows = m.services.map(s => el("tr", {"data-service": s.namespace + "/" + s.name},
    el("td", {}, el("b", {}, s.namespace + "/" + s.name)), el("td", {}, s.type), el("td", {}, s.vips.join(", ") || "-"),
    el("td", {}, s.ports.map(p => pill((p.name ? p.name + ":" : "") + p.port + "/" + p.protocol))),
    el("td", {}, s.exporters.map(e => el("div", {}, e.cluster, el("span", {class: "muted"}, " " + e.readyEndpoints + "/" + e.endpoints + " ready")))),
    el("td", {}, s.conflicts.length ? s.conflicts.map(c => el("div", {class: "warn"}, c.cluster + ": " + c.field + ": " + c.message)) : el("span", {class: "muted"}, "none"))));
  replace("services", table(["Service", "Type", "VIPs", "Ports", "Exported by", "Conflicts"], rows));
}

// ---- events

function renderEvents(m) {
  const rows = m.events.map(e => el("tr", {"data-kind": e.kind},
    el("td", {}, new Date(e.time).toLocaleTimeString()), el("td", {}, pill(e.kind, e.kind === "pair-down" ? "down" : e.kind === "pair-up" ? "connected" : "")),
    el("td", {}, e.subject), el("td", {}, e.message)));
  replace("events", table(["Time", "Kind", "Subject", "What"], rows));
}

// ---- wiring

function render() {
  if (!mesh) return;
  const banner = document.getElementById("banner");
  banner.hidden = !mesh.error;
  banner.textContent = mesh.error ? "The broker does not answer (showing what it last said): " + mesh.error : "";
  renderSummary(mesh); renderMatrix(mesh); renderGraph(mesh); renderLinks(mesh);
  renderClusters(mesh); renderPolicies(mesh); renderServices(mesh); renderEvents(mesh);
  const st = document.getElementById("status");
  st.textContent = "revision " + mesh.revision + ", updated " + new Date(mesh.generatedAt).toLocaleTimeString();
}

function showPage() {
  const page = (location.hash || "#mesh").slice(1);
  for (const s of document.querySelectorAll(".page")) s.hidden = s.id !== "page-" + page;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === page);
}

function connect() {
  const st = document.getElementById("status");
  const es = new EventSource("/api/v1/stream");
  es.addEventListener("mesh", ev => {
    mesh = JSON.parse(ev.data);
    st.dataset.live = "live";
    render();
  });
  // EventSource reconnects by itself; say so meanwhile.
  es.onerror = () => { st.dataset.live = "offline"; st.textContent = "dashboard unreachable, retrying…"; };
}

window.addEventListener("hashchange", showPage);
showPage();
connect();
setInterval(() => { if (mesh) renderLinks(mesh); }, 5000); // the reports' ages
