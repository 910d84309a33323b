// The console's only script (served from /ui/static, as the Content-Security-Policy allows):
// the login sends the token in a header, and the approvals list refreshes every two seconds.
"use strict";

function setUpLogin() {
  const button = document.getElementById("login-button");
  if (!button) return;
  const token = document.getElementById("token");
  const error = document.getElementById("login-error");
  async function logIn() {
    error.hidden = true;
    const answer = await fetch("/ui/login", {
      method: "POST",
      headers: { Authorization: "Bearer " + token.value.trim() },
      credentials: "same-origin",
    });
    token.value = "";
    if (answer.ok) {
      window.location.assign("/ui/approvals");
    } else {
      error.textContent = "That is not an operator token.";
      error.hidden = false;
    }
  }
  button.addEventListener("click", logIn);
  token.addEventListener("keydown", (event) => { if (event.key === "Enter") logIn(); });
}

function setUpRefresh() {
  const box = document.querySelector("[data-refresh]");
  if (!box) return;
  // never move the list under an operator who is typing a reason or pointing at a button:
  // a tenant can make its own item vanish to shift another's Approve under the pointer
  let pointing = false;
  box.addEventListener("mouseenter", () => { pointing = true; });
  box.addEventListener("mouseleave", () => { pointing = false; });
  async function refresh() {
    const typing = box.contains(document.activeElement) && document.activeElement.tagName === "INPUT";
    if (typing || pointing) return;
    const answer = await fetch(box.dataset.refresh, { credentials: "same-origin" });
    if (answer.redirected || !answer.ok) return;
    const html = await answer.text();
    if (!pointing) box.innerHTML = html;
  }
  // the next refresh is planned once this one is over: slow answers never pile up
  async function loop() {
    try { await refresh(); } catch (_) { /* the next round tries again */ }
    setTimeout(loop, 2000);
  }
  setTimeout(loop, 2000);
}

document.addEventListener("DOMContentLoaded", () => { setUpLogin(); setUpRefresh(); });
