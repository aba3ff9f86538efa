// agentq operator view: a small enhancement; the page works without it.
// "/" moves the focus to the tenant filter (unless typing in a field already).
"use strict";
document.addEventListener("keydown", function (ev) {
  if (ev.key !== "/" || ev.ctrlKey || ev.metaKey || ev.altKey) return;
  var t = ev.target;
  if (t && (t.tagName === "INPUT" || t.tagName === "SELECT" || t.tagName === "TEXTAREA")) return;
  var f = document.getElementById("f-tenant");
  if (f) { ev.preventDefault(); f.focus(); f.select(); }
});
// A form button with data-confirm asks before it sends (suspending a tenant).
document.addEventListener("submit", function (ev) {
  var b = ev.submitter;
  var msg = b && b.getAttribute("data-confirm");
  if (msg && !window.confirm(msg)) ev.preventDefault();
});
