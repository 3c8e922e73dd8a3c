// A console block's copy button copies its commands only: not the `$ ` prompts, not the
// output lines, not a trailing `# exit N` (the status the tests expect). Material's button
// copies the `data-copy` attribute of the code element when it has one.
(function () {
  function commands(text) {
    const out = [];
    let more = false; // a command continued by a trailing backslash
    for (const line of text.split("\n")) {
      if (line.startsWith("$ ") || more) {
        out.push((line.startsWith("$ ") ? line.slice(2) : line).replace(/\s+# exit \d+\s*$/, ""));
        more = line.endsWith("\\");
      }
    }
    return out.join("\n");
  }
  function mark() {
    for (const code of document.querySelectorAll(".language-console code")) {
      if (code.querySelector(".gp")) code.setAttribute("data-copy", commands(code.textContent));
    }
  }
  if (typeof document$ !== "undefined") document$.subscribe(mark);
  else document.addEventListener("DOMContentLoaded", mark);
})();
