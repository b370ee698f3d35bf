// sparkcluster's console: the live parts of a server-rendered page, replaced from the gateway's
// Server-Sent Events (gateway/console). Each event is a JSON object: element id -> HTML the server
// escaped; an element is replaced only when its HTML changed, so keyboard focus elsewhere stays.
// No build step, no dependency. Licence: Apache-2.0, as the rest of sparkcluster.
(function () {
  "use strict";
  var url = document.body.getAttribute("data-live");
  if (!url || !window.EventSource) {
    return;
  }
  var seen = {};
  var refreshes = 0;
  var source = new EventSource(url);
  source.onmessage = function (event) {
    var parts;
    try {
      parts = JSON.parse(event.data);
    } catch (e) {
      return;
    }
    Object.keys(parts).forEach(function (id) {
      var el = document.getElementById(id);
      if (el && seen[id] !== parts[id]) {
        var focused = document.activeElement && el.contains(document.activeElement);
        if (!focused) {
          el.innerHTML = parts[id];
          seen[id] = parts[id];
        }
      }
    });
    refreshes += 1;
    document.body.setAttribute("data-refreshes", String(refreshes));
  };
  source.onerror = function () {
    document.body.setAttribute("data-live-state", "reconnecting");
  };
  source.onopen = function () {
    document.body.setAttribute("data-live-state", "open");
  };
})();
