"""Model formats and converters: what servekit knows of a model's file or fitted object, apart
from serving it.

- ``tabular_onnx``: scikit-learn, XGBoost and LightGBM models to ONNX, and the parity check that
  decides whether the ONNX model may answer for them (``convert: onnx`` and ``add_model``);
- ``convert``: a scikit-learn or PyTorch object handed to ``add_model`` turned into ONNX bytes
  (``torch_onnx``: the PyTorch export);
- ``native``: a scikit-learn estimator skl2onnx cannot convert, written as a joblib file;
- ``fitted_types``: the column types a fitted model records (an encoder's categories, ...);
- ``onnx_files``: which files an ONNX model makes onnxruntime read, and where they may lie.

It sits below the runtimes and the client in the layer table, so both use it; it imports only
the foundation (no runtime, protocol module or transport). A runtime's own load and predict
code stays in app/servekit/runtimes/.
"""
