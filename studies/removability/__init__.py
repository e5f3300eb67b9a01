"""The removability map: ``python -m studies.removability``.

Where does the training path decide whether a circuit can be removed? ``fade600->0`` vs
``forced_zero`` (and ``unforced``) over model size x task x budget, with the zero-gate accuracy
margin per cell and its t interval over seeds; writes ``results/removability/``. Module: :mod:`.map`.
"""
