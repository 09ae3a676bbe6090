"""The worked solutions of the chapters' exercises, one module per chapter (``ch01`` ...).

Each chapter ends with an *Exercises* section. A solution cell imports its chapter's module,
runs the solution and glues the numbers the solution's prose states, so an answer is computed
by the code it is about and tested (``tests/test_exercises_chNN.py``). A solution that changes
the code defines the changed function here, and the chapter shows it as a diff against the
listing it changes.
"""
