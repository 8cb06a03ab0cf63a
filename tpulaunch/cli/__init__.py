def main(argv=None):
    """Console-script entry point (`tpulaunch.cli:main`); the command line itself is in cli/app.py."""
    from tpulaunch.cli.app import main as run

    return run(argv)
