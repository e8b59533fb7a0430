// Trajectory viewer: draws one episode's workflow graph as inline SVG.
// The Python side has already placed every node on a (layer, slot) grid, so
// this only picks episodes and draws boxes and arrows. Model and task text is
// untrusted: it only ever reaches the page through textContent and
// setAttribute (never innerHTML), and the Python side escapes "<", ">" and "&"
// in the inline JSON so it cannot end the data script element.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const SVG = "http://www.w3.org/2000/svg";
  const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#e15759", "#9c755f"];
  const BOX = { w: 210, h: 76, dx: 40, dy: 46, pad: 20 };
  const $ = (id) => document.getElementById(id);
  const pick = { run: $("pick-run"), split: $("pick-split"), step: $("pick-step"), outcome: $("pick-outcome"),
                 episode: $("pick-episode") };
  let run = data.runs[0] || { name: "", roles: [], episodes: {} };  // an overlay: the run picked in `pick.run`

  function colour(node) {
    if (node.kind !== "turn") return "#9aa1ad";
    const index = run.roles.indexOf(node.role);
    return PALETTE[(index < 0 ? run.roles.length : index) % PALETTE.length];
  }

  function fmt(value) {
    return typeof value === "number" ? (Math.abs(value) >= 100 ? value.toFixed(0) : value.toFixed(3)) : "–";
  }

  function el(tag, attrs, text) {
    const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function option(select, value, label) {
    select.appendChild(el("option", { value: String(value) }, label));
  }

  function problem(node) {
    return Boolean(node.parse_error || node.error);
  }

  function episodes() {
    const split = pick.split.value;
    const step = Number(pick.step.value);
    let list = (run.episodes[split] || []).filter((e) => e.step === step);
    if (pick.outcome.value === "failed") list = list.filter((e) => e.failed);
    const sign = pick.outcome.value === "best" ? -1 : 1;
    // an ungraded episode (score null: it crashed, or nothing scored it) is neither the best nor the worst
    return list.slice().sort((a, b) => (a.score === null) - (b.score === null) || sign * (a.score - b.score));
  }

  function fillSteps() {
    const steps = [...new Set((run.episodes[pick.split.value] || []).map((e) => e.step))].sort((a, b) => a - b);
    pick.step.replaceChildren();
    steps.forEach((s) => option(pick.step, s, `step ${s}`));
    if (steps.length) pick.step.value = String(steps[steps.length - 1]);
    fillEpisodes();
  }

  function fillEpisodes() {
    const list = episodes();
    pick.episode.replaceChildren();
    list.forEach((e, i) => option(pick.episode, i,
                                  `${e.id}  task ${e.task_label}  score ${fmt(e.score)}${e.failed ? "  ⚠" : ""}`));
    show(list[0]);
    pick.episode.onchange = () => show(list[Number(pick.episode.value)]);
  }

  function summary(episode) {
    const box = $("episode-summary");
    box.replaceChildren();
    const line = (label, value, cls) => {
      const row = el("div", cls ? { class: cls } : {});
      row.appendChild(el("b", {}, label + " "));
      row.appendChild(el("code", {}, value));
      box.appendChild(row);
    };
    line("episode", `${episode.id} (task ${episode.task_label}, step ${episode.step}, ${episode.wall_s.toFixed(3)} s)`);
    line("task", episode.task);
    line("outcome", episode.outcome);
    line("rewards", JSON.stringify(episode.rewards));
    if (episode.error) line("error", episode.error, "error");
  }

  function drawGraph(episode) {
    if (!episode.nodes.length) {
      $("graph-box").replaceChildren(el("div", { class: "empty" }, "this episode recorded no turns"));
      return;
    }
    const layers = Math.max(...episode.nodes.map((n) => n.layer)) + 1;
    const slots = Math.max(...episode.nodes.map((n) => n.slot)) + 1;
    const width = 2 * BOX.pad + slots * (BOX.w + BOX.dx);  // one spare gap for edges bulging right
    const height = 2 * BOX.pad + layers * BOX.h + (layers - 1) * BOX.dy;
    const svg = el("svg:svg", { id: "episode-graph", width, height, viewBox: `0 0 ${width} ${height}`,
                                "data-episode": episode.id });
    const defs = el("svg:defs");
    const marker = el("svg:marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 8,
                                      markerHeight: 8, orient: "auto-start-reverse" });
    marker.appendChild(el("svg:path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#7a8294" }));
    defs.appendChild(marker);
    svg.appendChild(defs);
    const at = {};
    for (const n of episode.nodes) {
      at[n.id] = { x: BOX.pad + n.slot * (BOX.w + BOX.dx), y: BOX.pad + n.layer * (BOX.h + BOX.dy) };
    }
    for (const [a, b] of episode.edges) {
      if (!at[a] || !at[b]) continue;
      svg.appendChild(el("svg:path", { class: "edge", "marker-end": "url(#arrow)", d: edgePath(at[a], at[b]) }));
    }
    for (const n of episode.nodes) svg.appendChild(drawNode(n, at[n.id]));
    $("graph-box").replaceChildren(svg);
  }

  // Adjacent layers: a curve from bottom to top. Longer edges leave and enter on the right side,
  // bulging outwards, so they do not run through the boxes of the layers they skip.
  function edgePath(from, to) {
    if (to.y - from.y <= BOX.h + BOX.dy) {
      const x1 = from.x + BOX.w / 2, y1 = from.y + BOX.h, x2 = to.x + BOX.w / 2, y2 = to.y, mid = (y1 + y2) / 2;
      return `M ${x1} ${y1} C ${x1} ${mid}, ${x2} ${mid}, ${x2} ${y2}`;
    }
    const x1 = from.x + BOX.w, y1 = from.y + BOX.h / 2, x2 = to.x + BOX.w, y2 = to.y + BOX.h / 2;
    const bulge = Math.max(x1, x2) + BOX.dx * 0.8;
    return `M ${x1} ${y1} C ${bulge} ${y1}, ${bulge} ${y2}, ${x2} ${y2}`;
  }

  function drawNode(n, pos) {
    const attrs = { class: `node ${n.kind}${problem(n) ? " problem" : ""}`, "data-node-id": n.id,
                    transform: `translate(${pos.x},${pos.y})` };
    if (n.kind === "turn") attrs["data-role"] = n.role; else attrs["data-tool"] = n.tool;
    const g = el("svg:g", attrs);
    g.appendChild(el("svg:rect", { width: BOX.w, height: BOX.h, rx: n.kind === "turn" ? 6 : 16,
                                   fill: colour(n) + "33", stroke: colour(n) }));
    const lines = n.kind === "turn"
      ? [[`${n.role}  ·  ${n.id}`, "title"], [`reward ${fmt(n.reward)}   adv ${fmt(n.advantage)}`, ""],
         [`“${n.text}”`, ""], n.parse_error ? ["⚠ parse error", "bad"] : [`${n.tokens} tokens`, ""]]
      : [[`tool: ${n.tool}`, "title"], [`args ${n.arguments}`, ""], [n.error ? "⚠ tool error" : `→ ${n.result}`,
                                                                    n.error ? "bad" : ""]];
    lines.forEach(([text, cls], i) => {
      const short = text.length > 28 ? text.slice(0, 27) + "…" : text;
      g.appendChild(el("svg:text", { x: 8, y: 17 + i * 17, class: cls }, short));
    });
    g.appendChild(el("svg:title", {}, n.kind === "turn" ? n.text : String(n.result)));
    g.addEventListener("click", () => focus(n.id));
    return g;
  }

  function drawDetails(episode) {
    const box = $("node-details");
    box.replaceChildren();
    const ordered = episode.nodes.slice().sort((a, b) => a.layer - b.layer || a.slot - b.slot);
    for (const n of ordered) {
      const d = el("details", { "data-node-id": n.id, class: problem(n) ? "problem" : "" });
      d.style.borderLeftColor = colour(n);
      const head = n.kind === "turn"
        ? `${n.role} · ${n.id} — reward ${fmt(n.reward)}, advantage ${fmt(n.advantage)}, ${n.tokens} tokens`
        : `tool ${n.tool} · ${n.id}`;
      d.appendChild(el("summary", {}, head + (problem(n) ? "  ⚠ " + (n.parse_error || n.error) : "")));
      if (n.kind === "turn") chat(d, n);
      const fields = n.kind === "turn"
        ? [["response", n.text], ["parsed", n.parsed], ["parse error", n.parse_error]]
        : [["arguments", n.arguments], ["result", n.result], ["error", n.error]];
      for (const [label, value] of fields) {
        if (value === null || value === undefined) continue;
        d.appendChild(el("div", { class: "label" + (label.includes("error") ? " bad" : "") }, label));
        d.appendChild(el("pre", {}, String(value)));
      }
      box.appendChild(d);
    }
  }

  // A turn's chat side: continued/truncated badges, the role's conversation (or, for a role without
  // memory, just this turn's input) and the prompt exactly as rendered, template markers included.
  function chat(d, n) {
    const badges = el("div", { class: "badges" });
    if (n.continued === true) {
      badges.appendChild(el("span", { class: "badge continued", title: "the prompt ids extend this role's "
                                      + "previous turn (prompt + response) exactly, without re-tokenising" },
                            "continued"));
    }
    if (n.truncated === true) {
      badges.appendChild(el("span", { class: "badge truncated", title: "the prompt was cut to fit the "
                                      + "model's context" }, "truncated"));
    }
    if (badges.childNodes.length) d.appendChild(badges);
    const messages = (Array.isArray(n.messages) ? n.messages : [])
      .filter((m) => m && typeof m.role === "string" && typeof m.content === "string");
    if (messages.length) {
      const omitted = typeof n.messages_omitted === "number" && n.messages_omitted > 0 ? n.messages_omitted : 0;
      d.appendChild(el("div", { class: "label" }, `conversation (${messages.length + omitted} messages)`));
      const list = el("div", { class: "conversation" });
      messages.forEach((m, i) => {
        if (i === 1 && omitted) {
          list.appendChild(el("div", { class: "omitted" }, `… ${omitted} earlier messages left out`));
        }
        const item = el("div", { class: "message", "data-message-role": m.role });
        item.appendChild(el("div", { class: "who" }, m.role));
        item.appendChild(el("pre", {}, m.content));
        list.appendChild(item);
      });
      d.appendChild(list);
    } else if (typeof n.input === "string" && n.input) {
      d.appendChild(el("div", { class: "label" }, "input"));
      d.appendChild(el("pre", { class: "input" }, n.input));
    }
    if (n.prompt !== null && n.prompt !== undefined) {
      const prompt = el("details", { class: "prompt" });
      prompt.appendChild(el("summary", { class: "label" }, "rendered prompt (as the model saw it)"));
      prompt.appendChild(el("pre", {}, String(n.prompt)));
      d.appendChild(prompt);
    }
  }

  function focus(nodeId) {
    document.querySelectorAll("svg .node").forEach((g) => g.classList.toggle("selected", g.dataset.nodeId === nodeId));
    const d = document.querySelector(`#node-details details[data-node-id="${CSS.escape(nodeId)}"]`);
    if (d) { d.open = true; d.scrollIntoView({ block: "nearest" }); }
  }

  function show(episode) {
    if (!episode) {
      const why = pick.outcome.value === "failed" ? "no failed episodes at this step" : "no episodes recorded";
      $("graph-box").replaceChildren(el("div", { class: "empty" }, why));
      $("episode-summary").replaceChildren();
      $("node-details").replaceChildren();
      return;
    }
    summary(episode);
    drawGraph(episode);
    drawDetails(episode);
  }

  function legend() {
    const box = $("legend");
    box.replaceChildren();
    run.roles.forEach((role) => {
      const item = el("span", { "data-legend-role": role });
      const swatch = el("span", { class: "swatch" });
      swatch.style.background = colour({ kind: "turn", role });
      item.append(swatch, role);
      box.appendChild(item);
    });
  }

  function showRun() {
    const splits = Object.keys(run.episodes).filter((s) => run.episodes[s].length);
    pick.split.replaceChildren();
    splits.forEach((s) => option(pick.split, s, s));
    legend();
    if (splits.length) fillSteps(); else { pick.step.replaceChildren(); pick.episode.replaceChildren(); show(null); }
  }

  data.runs.forEach((r, i) => option(pick.run, i, r.name));
  if (data.runs.length < 2) $("pick-run-label").hidden = true;
  pick.run.onchange = () => { run = data.runs[Number(pick.run.value)]; showRun(); };
  pick.split.onchange = fillSteps;
  pick.step.onchange = fillEpisodes;
  pick.outcome.onchange = fillEpisodes;
  showRun();
})();
