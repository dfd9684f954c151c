// Opsdeck's few behaviours that need JavaScript: copy buttons and dialogs. Loaded with
// `defer`; listeners sit on the document, so content htmx swaps in works too.
"use strict";

function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    return navigator.clipboard.writeText(text);
  }
  // Plain HTTP has no clipboard API: copy through a selected, off-screen text area.
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.style.position = "fixed";
  area.style.left = "-9999px";
  document.body.appendChild(area);
  area.select();
  document.execCommand("copy");
  area.remove();
  return Promise.resolve();
}

function openMarkedDialogs() {
  // A dialog the server sent back open (to show what to correct) becomes modal again.
  document.querySelectorAll("dialog[data-open]").forEach((dialog) => {
    dialog.removeAttribute("data-open");
    if (dialog.open) dialog.close();
    dialog.showModal();
  });
}

document.addEventListener("click", (event) => {
  const copy = event.target.closest("[data-copy]");
  if (copy) {
    const label = copy.textContent;
    copyText(copy.dataset.copy).then(() => {
      copy.textContent = "Copied";
      setTimeout(() => { copy.textContent = label; }, 1500);
    });
    return;
  }
  const opener = event.target.closest("[data-dialog]");
  if (opener) {
    const dialog = document.getElementById(opener.dataset.dialog);
    if (dialog && !dialog.open) dialog.showModal();
    return;
  }
  const closer = event.target.closest("[data-close]");
  if (closer) closer.closest("dialog")?.close();
});

// Polling replaces the operations timeline every few seconds: what the reader unfolded or
// folded stays so.
let folding = new Map();
document.addEventListener("htmx:beforeSwap", (event) => {
  folding = new Map();
  if (event.detail.target.id !== "instance-operations") return;
  event.detail.target.querySelectorAll("li[id] > details").forEach((details) => {
    folding.set(details.parentElement.id, details.open);
  });
});

function keepFolding() {
  folding.forEach((open, id) => {
    const details = document.querySelector(`#${CSS.escape(id)} > details`);
    if (details) details.open = open;
  });
}

document.addEventListener("DOMContentLoaded", openMarkedDialogs);
document.addEventListener("htmx:afterSettle", () => {
  openMarkedDialogs();
  keepFolding();
});
