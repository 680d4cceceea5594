"""The act rehearsal of the committed workflows (`nox -s rehearse`, ci/rehearse/rehearse.py): plan (the job x event
pairs), actions (what the pinned remote actions map to), act (running act and reading its output), report (verdicts
and tables), cancel (the cancel check), run (the command line)."""
