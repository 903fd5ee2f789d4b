"""A script that fails the way config-driven trainers do: it parses a generated source snippet with
`ast.parse` and the SyntaxError propagates. The snippet's display name is coloured (ANSI bold, as
rich/colorama-styled tools pass names around), so the exception's message carries ANSI escapes.

GROUND TRUTH:
  steps            = 0 (it fails before training)
  exit code        diag check exits 3 (the script failed)
  findings         run.failed (error) located at THIS file, at the `ast.parse(...)` line (the user's
                   call), not at the standard library's ast.py; no raw ANSI escape (\x1b[) anywhere in
                   the JSON report; run.no-steps skipped, never an error (the script failed before its
                   first step)
"""
import ast
import sys

print("\x1b[31mloading model config\x1b[0m", file=sys.stderr)
source = "def build(:\n    return 1\n"
tree = ast.parse(source, filename="\x1b[1mconfig_snippet.py\x1b[0m")
print(tree)
