// Package dashboard holds the web dashboard's files, embedded in the
// binary: its page templates (html/template) and its static assets (CSS,
// the pages' scripts, and xterm.js vendored by scripts/vendor-web.sh). It
// serves nothing itself: internal/api's dashboard.go serves the pages and
// their sign-in, and the pages act only through the /v1 API.
//
// The pages run no inline script (the server's Content-Security-Policy
// forbids it): each page's script is a file under static/ that reads what
// it needs from data- attributes. Guest data is put in the page with
// textContent, never as HTML.
package dashboard
