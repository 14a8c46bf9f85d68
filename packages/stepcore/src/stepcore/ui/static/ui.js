// stepcore ui: the only script on these pages. It copies a code snippet to the clipboard.
'use strict';
document.addEventListener('click', async (event) => {
  const button = event.target.closest('button.copy');
  if (!button) return;
  const source = document.getElementById(button.dataset.copy);
  if (!source) return;
  const text = source.textContent;
  try {
    await navigator.clipboard.writeText(text);
  } catch (_) {
    // No clipboard access (a page not served from localhost): select the text for Ctrl+C instead.
    const range = document.createRange();
    range.selectNodeContents(source);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    button.textContent = 'selected: press Ctrl+C';
    return;
  }
  button.textContent = 'copied';
  setTimeout(() => { button.textContent = 'copy'; }, 1500);
});
