"""gdb script: steps through the second `open()` of `openbench open PATH 2` line by line and writes
the source file of every line it stops at (one per line) to $TRACE_OUT. The second call, so that
what the first open of a process sets up once (the tier's directory fd) is not counted.
Environment: TRACE_LIB (the preload library), TRACE_OUT; the table's as for any run."""
import gdb, os
lib = os.environ["TRACE_LIB"]
gdb.execute("set pagination off")
gdb.execute("set startup-with-shell off")
gdb.execute("set confirm off")
gdb.execute(f"set environment LD_PRELOAD={lib}")
gdb.execute("break main")
gdb.execute("run")
# In main: stop at our `open` (the preloaded definition wins the symbol lookup).
bp = gdb.Breakpoint("open")
bp.ignore_count = 1
gdb.execute("continue")
files = []
steps = 0
while steps < 200000:
    f = gdb.selected_frame()
    if f.name() == "main":
        break
    sal = f.find_sal()
    name = sal.symtab.fullname() if sal.symtab else "?"
    files.append(name)
    gdb.execute("step", to_string=True)
    steps += 1
out = os.environ.get("TRACE_OUT", "/dev/stdout")
with open(out, "w") as o:
    for n in files:
        o.write(n + "\n")
gdb.execute("kill")
