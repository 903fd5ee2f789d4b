(function () {
  "use strict";
  var errors = [];
  function record(msg) {
    var text = String(msg);
    errors.push(text);
    document.body.setAttribute("data-rendered", "error");
    var box = document.getElementById("diag-errors");
    if (box) {
      var li = document.createElement("li");
      li.textContent = text;
      box.appendChild(li);
      box.hidden = false;
    }
  }
  window.diagErrors = errors;
  window.diagRecordError = record;
  window.addEventListener("error", function (e) {
    record("error: " + (e.message || e.type) + (e.lineno ? " (line " + e.lineno + ":" + e.colno + ")" : ""));
  });
  document.addEventListener("securitypolicyviolation", function (e) {
    record("blocked by the content security policy: " + e.violatedDirective);
  });
  window.addEventListener("unhandledrejection", function (e) { record("unhandled rejection: " + e.reason); });
  var origError = console.error;
  console.error = function () {
    record("console.error: " + Array.prototype.map.call(arguments, String).join(" "));
    return origError.apply(console, arguments);
  };
})();
