//! [`Errors`]: every problem found in one attribute and fn, reported together, each on its own
//! token.

/// Several errors, reported together.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(errors) => errors.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub(crate) fn extend(&mut self, other: Errors) {
        if let Some(error) = other.0 {
            self.push(error);
        }
    }

    pub(crate) fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}
