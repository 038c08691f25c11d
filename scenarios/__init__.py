"""The bundled scenarios, installed as ``loadgen.scenarios`` (setup.py maps this folder there): a regular
package, so wheel and editable installs and ``importlib.resources`` treat it alike. ``loadgen scenario list``
shows them; ``loadgen/plan/bundled.py`` reads them."""
