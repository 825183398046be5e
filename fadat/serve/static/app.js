// fadat web page: translate one sentence with several strategies and draw the graph behind it.
// Plain browser JavaScript, no library, no network access beyond this server. Text from the
// model is always inserted as text (textContent), never as HTML.
"use strict";

const SIDE_BY_SIDE = ["greedy", "lookahead", "joint-viterbi"];
const SVG_NS = "http://www.w3.org/2000/svg";
const BOX_W = 96, BOX_H = 46, COL_W = 128, ROW_H = 70, MARGIN = 24;

const state = { health: null, graph: null, selected: null, results: [] };
const $ = (id) => document.getElementById(id);

// Passing probability -> fill colour: a white-to-blue ramp (like matplotlib's "Blues").
const RAMP = [[247, 251, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
function blues(p) {
  const x = Math.min(1, Math.max(0, p)) * (RAMP.length - 1);
  const k = Math.min(RAMP.length - 2, Math.floor(x));
  const t = x - k;
  const c = RAMP[k].map((v, i) => Math.round(v + t * (RAMP[k + 1][i] - v)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

// sentencepiece marks a word start with U+2581; show it as a visible underscore.
const piece = (token) => token.replace(/\u2581/g, "_");
const fmt = (x, digits = 2) => (x === null || x === undefined ? "–" : x.toFixed(digits));

function setStatus(message, error = false) {
  const el = $("status");
  el.textContent = message;
  el.className = error ? "error" : "";
}

async function postJSON(url, body) {
  const response = await fetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    const message = data && data.error ? data.error.message : `HTTP ${response.status}`;
    throw new Error(message);
  }
  return data;
}

async function init() {
  try {
    const response = await fetch("/health");
    state.health = await response.json();
  } catch (err) {
    setStatus(`cannot reach the server: ${err.message}`, true);
    return;
  }
  const h = state.health;
  $("model-info").textContent =
    `model ${h.model} (${h.model_type.toUpperCase()})` + (h.graph ? "" : ", no graph to show");
  const select = $("strategy");
  for (const name of Object.keys(h.strategies)) {
    const option = document.createElement("option");
    option.value = name;
    option.textContent = name;
    option.selected = name === h.default_strategy;
    select.appendChild(option);
  }
  drawLegend();
  $("form").addEventListener("submit", (event) => {
    event.preventDefault();
    translate();
  });
  for (const id of ["strategy", "min-passing"]) {
    $(id).addEventListener("change", () => {
      if (state.results.length) translate();
    });
  }
  document.body.dataset.ready = "true";
}

async function translate() {
  const text = $("source").value.replace(/\s*\n\s*/g, " ").trim();
  if (!text) {
    setStatus("type a sentence first", true);
    return;
  }
  const chosen = $("strategy").value;
  const names = [chosen, ...SIDE_BY_SIDE.filter((s) => s !== chosen && s in state.health.strategies)];
  $("translate").disabled = true;
  setStatus("translating…");
  document.body.dataset.state = "busy";
  try {
    const started = performance.now();
    if (state.health.graph) {
      const minPassing = Number($("min-passing").value);
      const graph = await postJSON("/v1/graph", {
        text, strategies: names, min_passing: minPassing, min_flow: Math.min(0.05, minPassing),
      });
      state.graph = graph;
      state.results = graph.paths;
    } else {
      state.graph = null;
      state.results = await Promise.all(names.map(async (strategy) => {
        const data = await postJSON("/v1/translate", { text: [text], strategy });
        return { strategy, ...data.translations[0] };
      }));
    }
    state.selected = chosen;
    render();
    setStatus(`done in ${Math.round(performance.now() - started)} ms`);
    document.body.dataset.state = "done";
  } catch (err) {
    setStatus(err.message, true);
    document.body.dataset.state = "error";
  } finally {
    $("translate").disabled = false;
  }
}

function render() {
  renderCards();
  if (state.graph) {
    $("graph-section").hidden = false;
    drawGraph(state.graph);
  } else {
    $("graph-section").hidden = true;
  }
}

function renderCards() {
  const box = $("results");
  box.replaceChildren();
  // Fixed order for the side-by-side view; the selected strategy first if it is another one.
  const order = [...state.results].sort((a, b) => rank(a.strategy) - rank(b.strategy));
  for (const r of order) {
    const card = document.createElement("div");
    card.className = "card" + (r.strategy === state.selected ? " selected" : "");
    card.dataset.strategy = r.strategy;
    const title = document.createElement("h3");
    title.textContent = r.strategy;
    const text = document.createElement("div");
    text.className = "text";
    text.textContent = r.text || "(empty)";
    const numbers = document.createElement("div");
    numbers.className = "numbers";
    numbers.textContent =
      `confidence ${fmt(r.confidence)} · log P(y|x) ${fmt(r.log_prob)} · score ${fmt(r.score)}`;
    const meter = document.createElement("div");
    meter.className = "meter";
    const fill = document.createElement("div");
    fill.style.width = `${Math.round(100 * (r.confidence || 0))}%`;
    meter.appendChild(fill);
    card.append(title, text, numbers, meter);
    card.addEventListener("click", () => {
      state.selected = r.strategy;
      render();
    });
    box.appendChild(card);
  }
}

function rank(strategy) {
  const k = SIDE_BY_SIDE.indexOf(strategy);
  return k < 0 ? -1 : k;
}

function svg(tag, attrs = {}, parent = null) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, String(value));
  if (parent) parent.appendChild(el);
  return el;
}

function drawGraph(graph) {
  const root = $("graph");
  root.replaceChildren();
  const path = (graph.paths.find((p) => p.strategy === state.selected) || graph.paths[0]).vertices;
  const onPath = new Set(path);
  const pathLinks = new Set(path.slice(1).map((v, k) => `${path[k]}-${v}`));

  // Layout: column = the vertex's layer, rows in vertex order within a column.
  const columns = new Map();
  for (const v of graph.vertices) {
    if (!columns.has(v.layer)) columns.set(v.layer, []);
    columns.get(v.layer).push(v);
  }
  const rows = Math.max(...[...columns.values()].map((c) => c.length));
  const position = new Map();
  for (const [layer, members] of columns) {
    members.sort((a, b) => a.id - b.id);
    const offset = (rows - members.length) / 2;
    members.forEach((v, row) => {
      position.set(v.id, { x: MARGIN + layer * COL_W, y: MARGIN + (row + offset) * ROW_H });
    });
  }
  const layers = Math.max(...graph.vertices.map((v) => v.layer)) + 1;
  const width = 2 * MARGIN + (layers - 1) * COL_W + BOX_W;
  const height = 2 * MARGIN + (rows - 1) * ROW_H + BOX_H;
  root.setAttribute("viewBox", `0 0 ${width} ${height}`);
  // Shrink a wide graph to the page, down to 60 % of its size; wider ones scroll.
  const room = $("graph-box").clientWidth - 2;
  const scale = width > room ? Math.max(0.6, room / width) : 1;
  root.setAttribute("width", Math.round(width * scale));
  root.setAttribute("height", Math.round(height * scale));
  root.dataset.graphSize = graph.graph_size;
  root.dataset.strategy = state.selected;

  const defs = svg("defs", {}, root);
  for (const [id, colour] of [["arrow", "#6e7781"], ["arrow-path", "#d62728"]]) {
    const marker = svg("marker", {
      id, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 6, markerHeight: 6,
      orient: "auto-start-reverse",
    }, defs);
    svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: colour }, marker);
  }

  // Links under the vertices; the chosen path's links last, so they are on top.
  const links = svg("g", { class: "links" }, root);
  const sorted = [...graph.links].sort(
    (a, b) => pathLinks.has(`${a.from}-${a.to}`) - pathLinks.has(`${b.from}-${b.to}`));
  for (const link of sorted) {
    const a = position.get(link.from), b = position.get(link.to);
    const chosen = pathLinks.has(`${link.from}-${link.to}`);
    const x1 = a.x + BOX_W, y1 = a.y + BOX_H / 2, x2 = b.x, y2 = b.y + BOX_H / 2;
    const bend = Math.max(20, (x2 - x1) / 2);
    const line = svg("path", {
      class: "link" + (chosen ? " on-path" : ""),
      d: `M ${x1} ${y1} C ${x1 + bend} ${y1}, ${x2 - bend} ${y2}, ${x2} ${y2}`,
      "stroke-width": chosen ? 3 : 0.8 + 3 * link.flow,
      "stroke-opacity": chosen ? 0.9 : 0.25 + 0.6 * link.flow,
      "marker-end": `url(#${chosen ? "arrow-path" : "arrow"})`,
      "data-from": link.from,
      "data-to": link.to,
      "data-flow": link.flow.toFixed(4),
    }, links);
    svg("title", {}, line).textContent =
      `${link.from} → ${link.to}: used by ${(100 * link.flow).toFixed(1)}% of paths`;
  }

  const vertices = svg("g", { class: "vertices" }, root);
  for (const v of graph.vertices) {
    const { x, y } = position.get(v.id);
    const g = svg("g", {
      class: "vertex" + (onPath.has(v.id) ? " on-path" : ""),
      transform: `translate(${x},${y})`,
      "data-vertex": v.id,
      "data-passing": v.passing.toFixed(4),
    }, vertices);
    svg("rect", { width: BOX_W, height: BOX_H, rx: 6, fill: blues(v.passing) }, g);
    const dark = v.passing > 0.7;
    const top = v.tokens[0];
    const label = svg("text", {
      x: BOX_W / 2, y: 20, "text-anchor": "middle", fill: dark ? "#fff" : "#1b1f24",
    }, g);
    label.textContent = top ? truncate(piece(top.token), 12) : "";
    const detail = svg("text", {
      class: "vid", x: BOX_W / 2, y: 36, "text-anchor": "middle", fill: dark ? "#e6edf3" : "#57606a",
    }, g);
    detail.textContent = `v${v.id} · p ${top ? top.p.toFixed(2) : "–"}`;
    g.addEventListener("mouseenter", (event) => showTooltip(event, v));
    g.addEventListener("mousemove", moveTooltip);
    g.addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
  }
}

function truncate(text, n) {
  return text.length > n ? text.slice(0, n - 1) + "…" : text;
}

function showTooltip(event, v) {
  const tip = $("tooltip");
  tip.replaceChildren();
  const head = document.createElement("div");
  head.textContent = `vertex ${v.id} · passing probability ${v.passing.toFixed(3)}`;
  const table = document.createElement("table");
  for (const t of v.tokens) {
    const row = table.insertRow();
    const token = row.insertCell();
    token.textContent = piece(t.token);
    const p = row.insertCell();
    p.className = "p";
    p.textContent = t.p.toFixed(3);
  }
  tip.append(head, table);
  tip.hidden = false;
  tip.dataset.vertex = v.id;
  moveTooltip(event);
}

function moveTooltip(event) {
  const tip = $("tooltip");
  tip.style.left = `${event.clientX + 14}px`;
  tip.style.top = `${event.clientY + 14}px`;
}

function drawLegend() {
  const legend = $("legend");
  const label = document.createElement("span");
  label.textContent = "passing probability 0";
  const bar = document.createElement("canvas");
  bar.className = "bar";
  bar.width = 160;
  bar.height = 10;
  const ctx = bar.getContext("2d");
  for (let i = 0; i < 160; i++) {
    ctx.fillStyle = blues(i / 159);
    ctx.fillRect(i, 0, 1, 10);
  }
  const one = document.createElement("span");
  one.textContent = "1";
  legend.append(label, bar, one);
}

init();
