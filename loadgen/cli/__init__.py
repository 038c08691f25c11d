"""The command line (typer): ``loadgen run | sweep | report | compare | validate | check | history | ui | worker |
advise | target | dataset``. cli/app.py registers every command; cli/main.py is the entry point; commands parse
flags and call ``loadgen.api``; exit codes are the verdict's."""
