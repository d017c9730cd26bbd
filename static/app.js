// Live parts of the dashboard listen for "quorra:tick" on <body> (hx-trigger="quorra:tick
// from:body"). Ticks stop while the tab is hidden, and one comes at once when it shows
// again, so a forgotten tab costs the server nothing. No eval: the CSP forbids it.
(function () {
  "use strict";
  var TICK_MS = 2000;
  function tick() {
    if (document.visibilityState === "visible" && window.htmx) {
      window.htmx.trigger(document.body, "quorra:tick");
    }
  }
  setInterval(tick, TICK_MS);
  document.addEventListener("visibilitychange", tick);
  // A form marked data-reset empties itself once its action succeeded (a new user's
  // password does not stay on the page).
  document.addEventListener("htmx:afterRequest", function (event) {
    var form = event.detail.elt;
    if (event.detail.successful && form.tagName === "FORM" && form.hasAttribute("data-reset")) {
      form.reset();
    }
  });
  // An action's answer is a flash message; clear old ones after a while.
  document.addEventListener("htmx:afterSwap", function (event) {
    var flash = document.getElementById("flash");
    if (flash && event.detail.target === flash && !flash.querySelector(".secret")) {
      var shown = flash.innerHTML;
      setTimeout(function () { if (flash.innerHTML === shown) flash.innerHTML = ""; }, 15000);
    }
  });
})();
