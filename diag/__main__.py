from diag.cli import entry

entry()
