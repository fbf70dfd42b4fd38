"""`mlbench dashboard`: watch, compare and start runs in the browser.

A small Starlette application served by uvicorn on 127.0.0.1: plain HTML/JS pages (charts drawn
with the vendored uPlot, so it works offline), a JSON API over the run store, and one stream of
server-sent events per page for live updates. It reads runs through the functions `status`,
`compare` and `charts` use (:mod:`mlbench.results`) and starts them with the launchers `run`
uses (:mod:`mlbench.launch`); it adds views, never a second summary (ARCHITECTURE.md, "The
dashboard and the network").
"""
