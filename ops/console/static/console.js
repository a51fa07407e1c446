// The console works without this script; it only adds the copy button's action.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("[data-copy]");
  if (!button) return;
  const field = document.getElementById(button.dataset.copy);
  field.select();
  try {
    await navigator.clipboard.writeText(field.value);
  } catch (_) {
    document.execCommand("copy");
  }
  button.textContent = "Copied";
});
