"""Loaded by every Python process that `iolens run` starts (its folder leads PYTHONPATH).

It turns on DataLoader timing when IOLENS_RUN_DIR is set, then hands over
to the sitecustomize that would have run without iolens, if any. Nothing
here may stop the user's program: every failure is recorded and ignored.
"""

import os
import sys


def _iolens_boot() -> None:
    run_dir = os.environ.get("IOLENS_RUN_DIR")
    if not run_dir:
        return
    pkg_parent = os.environ.get("IOLENS_PKG_PARENT")
    added = False
    try:
        try:
            import iolens.training._hooks as hooks
        except ImportError:
            # The job's interpreter lacks iolens (another venv): use the copy that started it.
            if not pkg_parent:
                raise
            sys.path.append(pkg_parent)
            added = True
            import iolens.training._hooks as hooks
        flush_ms = int(os.environ.get("IOLENS_FLUSH_MS", "500"))
        hooks.start(os.path.join(run_dir, "timing"), flush_ms * 1_000_000,
                    os.environ.get("IOLENS_TIMING_SPARE") or None)
        hooks.install_import_hook()
    except Exception as exc:  # noqa: BLE001 - the job must run whatever happens here
        try:
            os.makedirs(os.path.join(run_dir, "timing"), exist_ok=True)
            # O_EXCL|O_NOFOLLOW: never through a link planted there (NOTE [no writes
            # through links] in iolens/rundir/__init__.py); this note is all it would lose.
            fd = os.open(os.path.join(run_dir, "timing", f"{os.getpid()}.json"),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
            with os.fdopen(fd, "w") as fh:
                fh.write('{"pid": %d, "installed": false, "error": %r}\n'
                         % (os.getpid(), f"iolens bootstrap failed: {exc!r}"))
        except OSError:
            pass
    finally:
        if added and pkg_parent in sys.path:
            sys.path.remove(pkg_parent)


def _chain() -> None:
    """Import the next sitecustomize on the path, as if iolens' were not there."""
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import sitecustomize  # noqa: F401 - the user's own, if any
    except ImportError as exc:
        if exc.name != "sitecustomize":
            print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{exc!r}",
                  file=sys.stderr)
        if ours is not None:
            sys.modules["sitecustomize"] = ours
    except Exception as exc:  # noqa: BLE001 - site.py reports and continues, so do we
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{exc!r}",
              file=sys.stderr)
    finally:
        sys.path[:] = [p for p in saved if os.path.abspath(p or ".") != here]


_iolens_boot()
_chain()
