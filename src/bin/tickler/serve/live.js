// tickler serve's live refresh (/?live=1): every few seconds it reads
// /api/summary and writes the counts, waits, marks, the attention list and
// the plot into the page in place. Buttons and forms are never replaced,
// so nothing moves under a pointer about to click. Served by tickler
// itself; the page's Content-Security-Policy allows no other script.
(function () {
  "use strict";
  var every = 2000;
  var status = document.getElementById("live-status");
  function each(selector, f) {
    Array.prototype.forEach.call(document.querySelectorAll(selector), f);
  }
  function mark(el, attention) {
    el.classList.toggle("attention", attention);
    el.classList.toggle("ok", !attention);
  }
  function apply(s) {
    var seen = {};
    s.queues.forEach(function (q) {
      seen[q.queue] = true;
      each("td[data-state]", function (td) {
        if (td.dataset.queue === q.queue) {
          var text = q.counts[td.dataset.state] || "0";
          if (td.textContent !== text) td.textContent = text;
        }
      });
      each("td[data-wait]", function (td) {
        if (td.dataset.wait === q.queue) td.textContent = q.wait;
      });
      each("td[data-status]", function (td) {
        if (td.dataset.status === q.queue) {
          td.textContent = q.status;
          mark(td, q.attention);
        }
      });
    });
    var rows = document.querySelectorAll("tr[data-queue-row]");
    var fresh = s.queues.length !== rows.length;
    s.schedules.forEach(function (sc) {
      each("tr[data-schedule] td.mark", function (td) {
        if (td.parentNode.dataset.schedule === sc.schedule) {
          td.textContent = sc.status;
          mark(td, sc.attention);
        }
      });
    });
    var attention = document.getElementById("attention");
    if (attention) attention.outerHTML = s.attention_html;
    var activity = document.getElementById("activity");
    if (activity) activity.innerHTML = s.activity_html;
    if (status) {
      status.textContent = "live: updated " + new Date().toLocaleTimeString() +
        (fresh ? "; the queues changed, reload for their rows" : "");
    }
  }
  function tick() {
    fetch("/api/summary", { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(apply)
      .catch(function (e) {
        if (status) status.textContent = "live: the last refresh failed (" + e.message + ")";
      })
      .then(function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
