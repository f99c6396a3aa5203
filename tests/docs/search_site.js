// Types a query into the search box of a built site (the output of `mkdocs build`) in headless
// Chromium, as a reader does, and prints the result links in the order shown, one a line.
//
//   node tests/docs/search_site.js SITE_DIR QUERY
//
// Served on 127.0.0.1 on a free port; Debian's chromium driven by playwright-core, as
// scripts/check-docs-browser does.
"use strict";

const fs = require("node:fs");
const http = require("node:http");
const path = require("node:path");
const { chromium } = require("playwright-core");

const TYPES = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".json": "application/json" };
const [root, query] = process.argv.slice(2).map((arg, i) => (i === 0 ? path.resolve(arg) : arg));

const server = http.createServer((request, response) => {
  let file = path.join(root, decodeURIComponent(new URL(request.url, "http://127.0.0.1").pathname));
  if (!file.startsWith(root)) file = root + "/missing";
  if (fs.existsSync(file) && fs.statSync(file).isDirectory()) file = path.join(file, "index.html");
  if (!fs.existsSync(file)) {
    response.writeHead(404);
    response.end();
    return;
  }
  response.writeHead(200, { "content-type": TYPES[path.extname(file)] || "application/octet-stream" });
  fs.createReadStream(file).pipe(response);
});

server.listen(0, "127.0.0.1", async () => {
  const browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    await page.goto(`http://127.0.0.1:${server.address().port}/`, { waitUntil: "load" });
    // Results appear once the search worker has built its index: wait for the first, and a
    // moment for the list to settle.
    await page.click(".md-search__input");
    await page.keyboard.type(query);
    await page.waitForSelector(".md-search-result__item > a", { timeout: 30000 });
    await page.waitForTimeout(500);
    const links = await page.$$eval(".md-search-result__item > a", (anchors) =>
      anchors.map((a) => new URL(a.href).pathname),
    );
    console.log(links.join("\n"));
  } finally {
    await browser.close();
    server.close();
  }
});
