import sys

from fastops.doctor.cli import main

if __name__ == "__main__":  # spawned trial processes import this module too
    sys.exit(main())
