// The one piece of script: ask before a restore. Without JavaScript the form posts straight away.
document.addEventListener("submit", function (event) {
  var text = event.target.getAttribute("data-confirm");
  if (text && !window.confirm(text)) { event.preventDefault(); }
});
