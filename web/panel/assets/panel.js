// agentq tenant usage panel: polls the usage of this link's tenant and updates the
// page in place (no reload). The page is complete without it.
(function () {
  "use strict";
  var token = new URLSearchParams(window.location.search).get("token") || "";
  var every = 5000;
  var labels = {};
  document.querySelectorAll("[data-limit] h3").forEach(function (h) {
    var el = h.closest("[data-limit]");
    labels[el.getAttribute("data-limit")] = h.firstChild ? h.firstChild.textContent.trim() : "";
  });

  function num(f) { return String(f); }
  function group(s) {
    var parts = s.split("."), i = parts[0], neg = i.charAt(0) === "-";
    if (neg) { i = i.slice(1); }
    i = i.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
    return (neg ? "-" : "") + i + (parts.length > 1 ? "." + parts[1] : "");
  }
  function amount(f, unit) {
    if (unit === "usd") { // cents, and up to four decimals when there are more
      var s = f.toFixed(4);
      while (s.charAt(s.length - 1) === "0" && s.length - s.indexOf(".") > 3) { s = s.slice(0, -1); }
      return "$" + group(s);
    }
    if (f === Math.trunc(f)) { return group(f.toFixed(0)); }
    return String(Math.round(f * 100) / 100);
  }
  function countdown(ms) {
    var s = Math.max(0, Math.round(ms / 1000));
    if (s >= 172800) { return Math.floor(s / 86400) + "d " + Math.floor(s / 3600) % 24 + "h"; }
    if (s >= 3600) { return Math.floor(s / 3600) + "h " + Math.floor(s / 60) % 60 + "m"; }
    if (s >= 60) { return Math.floor(s / 60) + "m " + s % 60 + "s"; }
    return s + "s";
  }
  function level(used, limit) {
    if (limit <= 0 || used >= limit) { return "full"; }
    if (used >= limit * 0.9) { return "high"; }
    if (used >= limit * 0.8) { return "warn"; }
    return "ok";
  }
  function text(el, s) { if (el && el.textContent !== s) { el.textContent = s; } }
  function cell(tr, s, code, title) {
    var td = document.createElement("td");
    if (code) {
      var c = document.createElement("code");
      c.textContent = s;
      if (title) { c.title = title; }
      td.appendChild(c);
    } else {
      td.textContent = s;
    }
    tr.appendChild(td);
    return td;
  }
  function utc(iso) { return iso ? iso.replace("T", " ").replace(/(\.\d+)?Z$/, "") : ""; }

  function updateLimit(el, lu, now) {
    // used is null while Redis, which counts it, does not answer (degraded).
    var unknown = lu.used === null, used = unknown ? 0 : lu.used, off = lu.limit === null || lu.limit === undefined;
    el.setAttribute("data-used", num(used));
    el.setAttribute("data-limit-value", off ? "unlimited" : num(lu.limit));
    if (el.getAttribute("data-scope") === "key") {
      text(el.querySelector("strong"), off ? "unlimited" : amount(lu.limit, lu.unit));
      el.setAttribute("data-used", "0");
      return;
    }
    var lvl = off ? "off" : level(used, lu.limit);
    el.className = "limit lvl-" + lvl;
    var pct = off ? 0 : (lu.limit > 0 ? Math.min(100, used / lu.limit * 100) : 100);
    pct = Math.round(pct * 10) / 10;
    var usedT = unknown ? "unknown right now" : amount(used, lu.unit), limT = off ? "unlimited" : amount(lu.limit, lu.unit);
    text(el.querySelector(".used"), usedT);
    text(el.querySelector(".max"), limT);
    var bar = el.querySelector(".bar");
    if (!off) {
      bar.setAttribute("aria-valuemax", num(lu.limit));
      bar.setAttribute("aria-valuenow", num(used));
      bar.setAttribute("aria-valuetext", usedT + " of " + limT + " (" + pct + " %)");
    }
    var fill = el.querySelector(".fill");
    if (fill) { fill.setAttribute("width", String(pct)); }
    text(el.querySelector(".remaining"), off ? "no limit" : (lu.remaining === null ? "" : amount(lu.remaining, lu.unit) + " remaining"));
    var reset = el.querySelector(".reset");
    if (reset) {
      var at = lu.reset_at ? Date.parse(lu.reset_at) : 0;
      if (at && at > now + 1000 && used > 0) {
        reset.setAttribute("datetime", lu.reset_at);
        reset.hidden = false;
      } else {
        reset.removeAttribute("datetime");
        reset.hidden = true;
      }
    }
    var rej = el.querySelector(".rejected");
    if (rej) {
      rej.hidden = !lu.rejected;
      text(rej, lu.rejected ? lu.rejected + " refused" : "");
    }
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll("time.reset[datetime]").forEach(function (t) {
      text(t, "resets in " + countdown(Date.parse(t.getAttribute("datetime")) - now));
    });
  }

  function svg(name, attrs) {
    var e = document.createElementNS("http://www.w3.org/2000/svg", name);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    return e;
  }
  function updateCharts(days) {
    var series = { steps: function (d) { return d.steps; }, tokens: function (d) { return d.tokens; },
      usd: function (d) { return d.cost_micro_usd / 1e6; } };
    Object.keys(series).forEach(function (id) {
      var fig = document.querySelector('[data-chart="' + id + '"]');
      if (!fig || !days.length) { return; }
      var unit = id === "usd" ? "usd" : id, val = series[id], max = 0, total = 0;
      days.forEach(function (d) { max = Math.max(max, val(d)); total += val(d); });
      var s = fig.querySelector("svg");
      s.querySelectorAll("rect").forEach(function (r) { r.remove(); });
      var w = 600 / days.length;
      days.forEach(function (d, i) {
        var v = val(d), h = max > 0 ? v / max * 120 : 0;
        if (v > 0 && h < 1) { h = 1; }
        var r = svg("rect", { x: (i * w + w * 0.1).toFixed(2), y: (120 - h).toFixed(2), width: (w * 0.8).toFixed(2), height: h.toFixed(2) });
        var t = svg("title", {});
        t.textContent = d.day + ": " + amount(v, unit);
        r.appendChild(t);
        s.appendChild(r);
      });
      text(fig.querySelector(".ctotal strong"), amount(total, unit));
      var spans = fig.querySelectorAll(".axislabels span");
      if (spans.length === 3) {
        text(spans[0], days[0].day);
        text(spans[1], "max " + amount(max, unit));
        text(spans[2], days[days.length - 1].day);
      }
      s.setAttribute("aria-label", fig.querySelector(".ctitle").textContent + ", " + days[0].day + " to " +
        days[days.length - 1].day + ": total " + amount(total, unit) + ", highest day " + amount(max, unit));
    });
    var tb = document.querySelector("#days-table tbody");
    if (tb) {
      tb.textContent = "";
      days.forEach(function (d) {
        var tr = document.createElement("tr"), th = document.createElement("th");
        th.scope = "row";
        th.textContent = d.day;
        tr.appendChild(th);
        cell(tr, String(d.steps)); cell(tr, String(d.tokens)); cell(tr, d.cost_usd);
        tb.appendChild(tr);
      });
    }
  }

  function updateTasks(rep) {
    text(document.getElementById("q-running"), String(rep.queue.running));
    text(document.getElementById("q-depth"), String(rep.queue.depth));
    var tb = document.querySelector("#tasks tbody");
    tb.textContent = "";
    if (!rep.tasks.length) {
      var tr = document.createElement("tr");
      tr.className = "empty";
      cell(tr, "No task is running or queued.").colSpan = 7;
      tb.appendChild(tr);
      return;
    }
    rep.tasks.forEach(function (t) {
      var tr = document.createElement("tr");
      tr.setAttribute("data-task", t.id);
      cell(tr, t.id.slice(-8), true, t.id);
      var st = cell(tr, "");
      var sp = document.createElement("span");
      sp.className = "state st-" + t.state;
      sp.textContent = t.state;
      st.appendChild(sp);
      var ag = cell(tr, t.agent);
      if (t.tree) {
        var sm = document.createElement("small");
        sm.className = "tree";
        sm.textContent = "tree: " + t.tree.tasks + " tasks, " + t.tree.live + " live, $" + t.tree.cost_usd;
        ag.appendChild(document.createTextNode(" "));
        ag.appendChild(sm);
      }
      cell(tr, utc(t.created_at));
      var w = t.wait_reason;
      cell(tr, w ? w.reason + (w.until ? " until " + utc(w.until).slice(11) : "") : "");
      cell(tr, w && w.position ? String(w.position) : "");
      cell(tr, w && w.expected_start ? utc(w.expected_start).slice(11) : "");
      tb.appendChild(tr);
    });
  }

  function updateHits(rep) {
    var tb = document.querySelector("#hits tbody");
    tb.textContent = "";
    if (!rep.recent_limit_hits.length) {
      var tr = document.createElement("tr");
      tr.className = "empty";
      cell(tr, "No limit was hit recently.").colSpan = 6;
      tb.appendChild(tr);
      return;
    }
    rep.recent_limit_hits.forEach(function (h) {
      var tr = document.createElement("tr");
      tr.setAttribute("data-event", h.event_id);
      cell(tr, utc(h.time));
      var l = cell(tr, (labels[h.limit_type] || h.limit_type.replace(/_/g, " ")) + " ");
      var c = document.createElement("code");
      c.textContent = h.limit_type;
      l.appendChild(c);
      cell(tr, String(h.current_usage) + " / " + String(h.limit_value));
      cell(tr, h.sla_classification);
      cell(tr, h.enforcement);
      cell(tr, h.event_id, true);
      tb.appendChild(tr);
    });
  }

  function apply(rep) {
    var now = Date.now();
    document.querySelectorAll("[data-limit]").forEach(function (el) {
      var lu = rep.limits[el.getAttribute("data-limit")];
      if (lu) { updateLimit(el, lu, now); }
    });
    text(document.getElementById("plan"), rep.plan);
    var asOf = document.getElementById("as-of");
    var asOfText = rep.as_of.replace(/\.\d+Z$/, "Z");
    asOf.setAttribute("datetime", asOfText);
    text(asOf, asOfText);
    updateCharts(rep.days || []);
    updateTasks(rep);
    updateHits(rep);
    document.body.setAttribute("data-updated", String(now));
    tick();
  }

  var failures = 0;
  function poll() {
    fetch("/panel/t/usage?token=" + encodeURIComponent(token), { cache: "no-store", credentials: "omit" })
      .then(function (r) {
        if (r.status === 401 || r.status === 403) {
          return r.json().catch(function () { return {}; }).then(function (b) {
            var code = b && b.error && b.error.code;
            text(document.getElementById("refresh-state"), code === "LINK_REVOKED" ? "this link was revoked: updates stopped" :
              r.status === 403 ? "this link has expired: updates stopped" : "this link is not valid: updates stopped");
            return null;
          });
        }
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.json();
      })
      .then(function (rep) {
        if (rep === null) { return; }
        failures = 0;
        apply(rep);
        text(document.getElementById("refresh-state"), "updates every 5 seconds");
        setTimeout(poll, every);
      })
      .catch(function () {
        failures++;
        text(document.getElementById("refresh-state"), "update failed, retrying");
        setTimeout(poll, Math.min(60000, every * Math.pow(2, failures)));
      });
  }
  tick();
  setInterval(tick, 1000);
  setTimeout(poll, every);
})();
