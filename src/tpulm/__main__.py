from tpulm.cli import main

raise SystemExit(main())
